"""templates.toml / templates.json: what parses, and the message for what does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from orchard.scheduler.backends.base import CHECK_RUNTIME_CLASS, BackendError, Capability
from orchard.scheduler.backends.netpolicy.policy import NetworkPolicySpec
from orchard.scheduler.settings import CreateLimits
from orchard.scheduler.templates import TemplateConfigError, check_runtime_classes, load_templates

from orchard._proto.orchard.v1 import common_pb2
from tests.control.fake_backend import FakeBackend

LIMITS = CreateLimits()


def test_toml_with_defaults_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "templates.toml").write_text(
        '[templates.py]\nimage = "debian"\ncpu_millis = 250\nmin = 2\nmax = 8\n'
        'env = { A = "1" }\n\n[templates.bare]\n'
    )
    templates = load_templates(tmp_path, LIMITS)
    assert sorted(templates) == ["bare", "py"]
    py = templates["py"]
    assert (py.image, py.cpu_millis, py.min, py.max, py.env) == ("debian", 250, 2, 8, {"A": "1"})
    assert py.memory_bytes == LIMITS.default_memory_bytes
    bare = templates["bare"]
    assert (bare.image, bare.min, bare.max) == ("", 0, 16)


def test_json_form_and_no_file(tmp_path: Path) -> None:
    assert load_templates(tmp_path, LIMITS) == {}
    (tmp_path / "templates.json").write_text(json.dumps({"templates": {"j": {"max": 3}}}))
    assert load_templates(tmp_path, LIMITS)["j"].max == 3
    (tmp_path / "templates.toml").write_text("")
    with pytest.raises(TemplateConfigError, match="keep one"):
        load_templates(tmp_path, LIMITS)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[templates.Bad]\n", "template name 'Bad'"),
        ("[templates.t]\nmin = 5\nmax = 2\n", "max \\(2\\) is below min \\(5\\)"),
        ("[templates.t]\nflavour = 1\n", "unknown settings flavour"),
        ('[templates.t]\nruntime_class = "Kata!"\n', "runtime_class 'Kata!' is not a runtime"),
        ('[templates.t]\nnetwork = "wifi"\n', "network 'wifi' is not one of"),
        ('[templates.t]\nnetwork = "allowlist"\n', "ALLOWLIST needs at least one cidr"),
        ('[templates.t]\nnetwork = "internet"\ncidrs = ["1.2.3.0/24"]\n', "only allowed with"),
        ('[templates.t]\nnetwork = "allowlist"\ncidrs = ["127.0.0.0/8"]\n', "overlaps"),
        ('[templates.t]\nnetwork = "allowlist"\nports = ["443"]\n', "ports of integers"),
        ('[templates.t]\ndomains = "a.com"\n', "domains must be a list"),
        ("[templates.t]\ncpu_millis = 1\n", "cpu_millis must be between"),
        ('[templates.t]\nmin = "2"\n', "min must be an integer"),
        ('[templates.t]\nenv = { "1X" = "a" }\n', "not a valid variable name"),
        ('[templates.t]\nimage = "../etc"\n', "not a valid image name"),
        ("[pools.t]\n", "unknown top-level keys: pools"),
        ("[templates\n", "cannot parse"),
    ],
)
def test_bad_files_name_the_template_and_field(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "templates.toml").write_text(body)
    with pytest.raises(TemplateConfigError, match=message):
        load_templates(tmp_path, LIMITS)


def test_network_classes_and_runtime_classes_parse(tmp_path: Path) -> None:
    (tmp_path / "templates.toml").write_text(
        '[templates.web]\nnetwork = "allowlist"\ncidrs = ["203.0.113.0/24"]\nports = [443]\n'
        'domains = ["PyPI.org", "*.pythonhosted.org"]\nruntime_class = "injected"\n\n'
        '[templates.open]\nnetwork = "internet"\nruntime_class = "gvisor"\n'
    )
    templates = load_templates(tmp_path, LIMITS)
    web, open_ = templates["web"], templates["open"]
    assert web.network == NetworkPolicySpec(
        "allowlist", ("203.0.113.0/24",), (443,), ("*.pythonhosted.org", "pypi.org")
    )
    assert web.network_mode == common_pb2.NetworkPolicy.ALLOWLIST
    assert web.to_proto().network.domains == ["*.pythonhosted.org", "pypi.org"]
    assert (web.runtime_class, open_.runtime_class) == ("injected", "gvisor")
    assert open_.network == NetworkPolicySpec("internet")


class _LocalLike(FakeBackend):
    """Stands in for a backend's check_runtime_class (the local backend's own rule is
    tested in tests/injected against the real backend)."""

    capabilities: frozenset[Capability[Any]] = frozenset({CHECK_RUNTIME_CLASS})

    def check_runtime_class(self, runtime_class: str) -> None:
        if runtime_class not in ("", "runc"):
            raise BackendError.invalid(f"runtime class {runtime_class!r} is not available")


def test_runtime_classes_are_checked_against_the_backend(tmp_path: Path) -> None:
    (tmp_path / "templates.toml").write_text('[templates.g]\nruntime_class = "gvisor"\n')
    templates = load_templates(tmp_path, LIMITS)
    with pytest.raises(TemplateConfigError, match="template 'g': runtime class 'gvisor'"):
        check_runtime_classes(templates, _LocalLike())
    check_runtime_classes(templates, FakeBackend())  # no check: the cluster decides


def test_the_local_backend_runs_runc_and_injected_only_with_a_bundle(tmp_path: Path) -> None:
    from orchard.scheduler.backends.local.backend import LocalBackend
    from orchard.scheduler.backends.local.settings import LocalSettings

    plain = LocalBackend(LocalSettings(home=tmp_path / "a"))
    for ok in ("", "runc"):
        plain.check_runtime_class(ok)
    for refused, why in (("injected", "needs an executor bundle"), ("gvisor", "not available")):
        with pytest.raises(BackendError, match=why) as err:
            plain.check_runtime_class(refused)
        assert err.value.client_fault
    bundled = LocalBackend(LocalSettings(home=tmp_path / "b", executor_bundle=tmp_path / "bundle"))
    bundled.check_runtime_class("injected")
    (tmp_path / "templates.toml").write_text('[templates.t]\nruntime_class = "injected"\n')
    templates = load_templates(tmp_path, LIMITS)
    with pytest.raises(TemplateConfigError, match="template 't': runtime class 'injected' needs"):
        check_runtime_classes(templates, plain)
    check_runtime_classes(templates, bundled)
