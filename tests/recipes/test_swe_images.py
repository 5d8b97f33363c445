"""recipes/swe/images.py on the in-process fake: every missing image named at once, a pull
that fails reported per image (a real subprocess standing in for ``orchard image pull``).
The pull path against a real registry and stack is in tests/runtime/test_image_pull_sandbox.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from orchard.recipes.swe.images import MissingImagesError, ensure_images, local_image_name

from orchard.testing import FakeOrchard

PRESENT = "sweb.eval.x86_64.astropy__astropy-12907:latest"


@pytest.fixture
def fake() -> Iterator[FakeOrchard]:
    with FakeOrchard(images=("debian", PRESENT)) as fake:
        yield fake


def test_local_names() -> None:
    assert local_image_name("swebench/sweb.eval.x86_64.astropy__astropy-12907") == PRESENT
    assert local_image_name("ghcr.io:443/a/b/c:v1@sha256:" + "0" * 64) == "c:v1"
    for bad in ("Upper/Case", "x:bad tag", "a/"):
        with pytest.raises(ValueError):
            local_image_name(bad)


def test_every_missing_image_is_named(fake: FakeOrchard) -> None:
    refs = [
        "swebench/sweb.eval.x86_64.astropy__astropy-12907:latest",
        "swebench/sweb.eval.x86_64.django__django-11099:latest",
        "swebench/sweb.eval.x86_64.sympy__sympy-20590",
        "Not/A/Ref",
    ]
    with fake.client() as client:
        plan = ensure_images(refs[:1], client)
        assert plan.names == {refs[0]: PRESENT} and plan.pulled == []
        with pytest.raises(MissingImagesError) as err:
            ensure_images(refs, client)
    assert set(err.value.missing) == set(refs[1:])
    assert err.value.reason == "IMAGE_NOT_FOUND"
    assert "3 image(s)" in err.value.message and "django__django-11099" in err.value.message


def test_failed_pulls_are_reported_per_image(fake: FakeOrchard) -> None:
    failing = [
        sys.executable,
        "-c",
        "import sys; sys.stderr.write('UNAUTHORIZED: nope\\n'); sys.exit(1)",
    ]
    refs = ["reg.example/x/one:1", "reg.example/x/two:2"]
    with fake.client() as client, pytest.raises(MissingImagesError) as err:
        ensure_images(refs, client, pull=True, orchard_command=failing)
    assert err.value.missing == {ref: "pull failed: UNAUTHORIZED: nope" for ref in refs}
    # A pull that "succeeds" without the image appearing is not taken on trust.
    succeeding = [sys.executable, "-c", "pass"]
    with fake.client() as client, pytest.raises(MissingImagesError) as err:
        ensure_images(refs[:1], client, pull=True, orchard_command=succeeding)
    assert "does not list 'one:1'" in err.value.missing[refs[0]]
