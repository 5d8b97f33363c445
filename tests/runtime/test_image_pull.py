"""``orchard image pull`` against a real registry (Debian's docker-registry) on loopback.

Images are OCI layouts built here from tar layers (whiteouts, a multi-platform
index, hostile members) and pushed with skopeo; the registry runs anonymous, behind
htpasswd, or behind a token server (:mod:`.registry_server`). The pulled layers
are checked on disk and through a real overlay mount (what a sandbox sees);
``test_image_pull_sandbox.py`` runs a sandbox from a pulled image.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from orchard.scheduler.backends.base import BackendError
from orchard.scheduler.backends.local.images import ImageStore
from orchard.scheduler.backends.local.pull import auth, manifests
from orchard.scheduler.backends.local.pull.errors import PullError
from orchard.scheduler.backends.local.pull.pull import PullEvent, pull_image
from orchard.scheduler.backends.local.pull.ref import (
    ImageRef,
    ReferenceError,
    local_name,
    parse_ref,
)

from .image_inputs import LAYER_1, LAYER_2, Entry, layer_tar
from .oci_images import ImageSpec, write_layout
from .registry_server import Registry, TokenServer, have_tools, running_registry
from .test_image_import import merged_view

needs_registry = pytest.mark.skipif(
    os.geteuid() != 0 or have_tools() is not None,
    reason=have_tools() or "whiteouts (mknod) and mounts need root",
)
BASE = [Entry("etc", "dir", mode=0o755), Entry("etc/os-release", data=b"ID=orchard-test\n")]


def pull(store: Path, ref: str, **kwargs: Any) -> tuple[Any, list[PullEvent]]:
    events: list[PullEvent] = []
    kwargs.setdefault("plain_http", True)
    image = asyncio.run(pull_image(store, ref, progress=events.append, **kwargs))
    return image, events


def pull_error(store: Path, ref: str, **kwargs: Any) -> BackendError:
    with pytest.raises(BackendError) as err:
        pull(store, ref, **kwargs)
    return err.value


# -- references, challenges, platforms, credentials (no registry) -------------


def test_references() -> None:
    assert parse_ref("python:3.11") == ImageRef("docker.io", "library/python", "3.11")
    assert parse_ref("swebench/sweb.eval.x86_64.django__django-11099") == ImageRef(
        "docker.io", "swebench/sweb.eval.x86_64.django__django-11099", "latest"
    )
    digest = "sha256:" + "a" * 64
    assert parse_ref(f"127.0.0.1:5000/a/b:1@{digest}") == ImageRef(
        "127.0.0.1:5000", "a/b", "1", digest
    )
    assert parse_ref("localhost/x").registry == "localhost"
    assert parse_ref("ghcr.io/o/r").api_host == "ghcr.io"
    assert parse_ref("ubuntu").api_host == "registry-1.docker.io"
    for bad in ("", "UPPER/case", "a/../b", "x:tag with space", "a@sha256:12", "h:99/x:", " x"):
        with pytest.raises(ReferenceError):
            parse_ref(bad)
    assert local_name(parse_ref("swebench/sweb.eval.x86_64.astropy__astropy-12907:v1")) == (
        "sweb.eval.x86_64.astropy__astropy-12907:v1"
    )


def test_the_recipe_names_images_as_the_pull_stores_them() -> None:
    """recipes/swe/images.py (public SDK only) carries its own copy of the naming rule."""
    from orchard.recipes.swe.images import local_image_name

    for ref in ("python", "python:3.11", "a/b/c:v1", "127.0.0.1:5000/swe/x__y-1:latest",
                f"ghcr.io/o/r:t@sha256:{'0' * 64}", "swebench/sweb.eval.x86_64.a__b-1"):  # fmt: skip
        assert local_image_name(ref) == local_name(parse_ref(ref)), ref


def test_challenges() -> None:
    c = auth.parse_challenge(
        'Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull"'
    )
    assert c.scheme == "bearer" and c.params["realm"] == "https://auth.example/token"
    assert c.params["scope"] == "repository:a/b:pull"
    assert auth.parse_challenge('Basic realm="x \\"y\\""').params == {"realm": 'x "y"'}
    for bad in ("Negotiate abc", 'Bearer realm="unterminated'):
        with pytest.raises(PullError) as err:
            auth.parse_challenge(bad)
        assert err.value.reason == "UNAUTHORIZED"


def test_platform_selection() -> None:
    def entry(plat: dict[str, str], n: int) -> dict[str, Any]:
        return {"mediaType": manifests.OCI_MANIFEST, "digest": "sha256:" + f"{n}" * 64,
                "size": 10, "platform": plat}  # fmt: skip

    index = json.dumps({"manifests": [
        entry({"os": "linux", "architecture": "amd64"}, 1),
        entry({"os": "linux", "architecture": "arm64", "variant": "v8"}, 2),
        entry({"os": "linux", "architecture": "arm", "variant": "v7"}, 3),
    ]}).encode()  # fmt: skip
    assert manifests.pick_platform(index, "linux/amd64", "i").digest.endswith("1" * 64)
    assert manifests.pick_platform(index, "linux/arm64", "i").digest.endswith("2" * 64)
    assert manifests.pick_platform(index, "linux/arm", "i").digest.endswith("3" * 64)
    with pytest.raises(PullError) as err:
        manifests.pick_platform(index, "linux/s390x", "i")
    assert err.value.reason == "PLATFORM_NOT_FOUND"
    assert "linux/amd64, linux/arm/v7, linux/arm64/v8" in err.value.message


def test_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.CREDENTIALS_ENV, raising=False)
    monkeypatch.delenv(auth.AUTH_FILE_ENV, raising=False)
    assert auth.find_credentials("r.example") is None
    path = tmp_path / "auth.json"
    encoded = base64.b64encode(b"alice:s3cret:colon").decode()
    path.write_text(json.dumps({"auths": {"r.example:5000": {"auth": encoded},
                                           "https://index.docker.io/v1/": {"auth": encoded}}}))  # fmt: skip
    assert auth.find_credentials("r.example:5000", path) == auth.Credentials(
        "alice", "s3cret:colon"
    )
    assert auth.find_credentials("docker.io", path) == auth.Credentials("alice", "s3cret:colon")
    assert auth.find_credentials("other.example", path) is None
    monkeypatch.setenv(auth.AUTH_FILE_ENV, str(path))
    assert auth.find_credentials("r.example:5000") is not None
    monkeypatch.setenv(auth.CREDENTIALS_ENV, "bob:pw")
    assert auth.find_credentials("anything") == auth.Credentials("bob", "pw")
    monkeypatch.setenv(auth.CREDENTIALS_ENV, "no-colon")
    with pytest.raises(PullError):
        auth.find_credentials("anything")
    path.write_text("{not json")
    monkeypatch.delenv(auth.CREDENTIALS_ENV)
    with pytest.raises(PullError) as err:
        auth.find_credentials("r.example:5000")
    assert "unreadable" in err.value.message


# -- against the registry -----------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "images"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry") as reg:
        yield reg


def two_layer_layout(tmp_path: Path, tag: str = "1") -> Path:
    return write_layout(
        tmp_path / f"layout-{tag}", tag, [ImageSpec([layer_tar(LAYER_1), layer_tar(LAYER_2)])]
    )


@needs_registry
def test_pull_applies_whiteouts_and_keeps_the_config(
    tmp_path: Path, store: Path, registry: Registry
) -> None:
    registry.push(two_layer_layout(tmp_path), "1", "team/tiny")
    image, events = pull(store, f"{registry.host}/team/tiny:1")
    assert image.name == "tiny:1" and image.layers == ["0", "1"]
    assert image.env["GREETING"] == "hi" and image.cwd == "/data"
    assert image.origin["user"] == "1000:1000" and image.origin["cmd"] == ["/bin/sh"]
    assert image.origin["source"] == f"{registry.host}/team/tiny:1"
    assert image.size_bytes > 0
    assert ImageStore(store).get("tiny:1").origin == image.origin
    lower, upper = image.layer_paths
    whiteout = os.lstat(upper / "etc/hello")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == os.makedev(0, 0)
    with merged_view(image.layer_paths) as merged:
        assert not (merged / "etc/hello").exists()
        assert (merged / "etc/keep").read_text() == "keep\n"
        assert sorted(os.listdir(merged / "data")) == ["c"]
        assert (merged / "etc/new").read_text() == "new\n"
    kinds = [e.event for e in events]
    assert kinds[0] == "resolved" and kinds[-1] == "done"
    assert kinds.count("layer-done") == 2 and kinds.count("unpacked") == 2

    # Pulled again: nothing downloaded, both layers already unpacked.
    _, again = pull(store, f"{registry.host}/team/tiny:1", name="tiny-copy:1")
    assert [e.status for e in again if e.event == "layer"] == ["cached", "cached"]
    assert ImageStore(store).get("tiny-copy:1").layer_paths[0].resolve() == lower.resolve()


@needs_registry
def test_multi_platform_index_and_shared_layers(
    tmp_path: Path, store: Path, registry: Registry
) -> None:
    base = layer_tar(BASE)
    amd = layer_tar([Entry("arch", data=b"amd64\n")])
    arm = layer_tar([Entry("arch", data=b"arm64\n")])
    layout = write_layout(tmp_path / "multi", "2", [
        ImageSpec([base, amd], platform="linux/amd64"),
        ImageSpec([base, arm], platform="linux/arm64/v8"),
    ])  # fmt: skip
    registry.push(layout, "2", "multi", all_platforms=True)
    ref = f"{registry.host}/multi:2"
    amd_image, events = pull(store, ref)
    assert events[0].extra["index"].startswith("sha256:")
    assert (amd_image.layer_paths[1] / "arch").read_text() == "amd64\n"
    arm_image, arm_events = pull(store, ref, platform="linux/arm64", name="multi-arm:2")
    assert (arm_image.layer_paths[1] / "arch").read_text() == "arm64\n"
    assert arm_image.origin["platform"] == "linux/arm64"
    # The base layer is the same blob in both: downloaded once, unpacked once, shared.
    assert next(e.status for e in arm_events if e.event == "layer") == "cached"
    assert amd_image.layer_paths[0].resolve() == arm_image.layer_paths[0].resolve()
    assert len(list((store / ".layers").glob("sha256-*"))) == 3
    err = pull_error(store, ref, platform="linux/s390x")
    assert err.reason == "PLATFORM_NOT_FOUND" and err.client_fault
    assert "linux/amd64" in err.message and "linux/arm64/v8" in err.message

    # A single-platform image for another architecture is not silently taken.
    registry.push(
        write_layout(tmp_path / "armonly", "1", [ImageSpec([arm], platform="linux/arm64")]),
        "1",
        "armonly",
    )
    err = pull_error(store, f"{registry.host}/armonly:1")
    assert err.reason == "PLATFORM_NOT_FOUND" and "--platform linux/arm64" in err.message
    assert pull(store, f"{registry.host}/armonly:1", platform="linux/arm64")[0].name == "armonly:1"


@needs_registry
def test_unknown_manifest_and_pinned_digest(
    tmp_path: Path, store: Path, registry: Registry
) -> None:
    registry.push(two_layer_layout(tmp_path), "1", "tiny")
    err = pull_error(store, f"{registry.host}/tiny:nope")
    assert err.reason == "MANIFEST_UNKNOWN" and "tiny:nope" in err.message
    err = pull_error(store, f"{registry.host}/nothing-here:1")
    assert err.reason == "MANIFEST_UNKNOWN"
    _image, events = pull(store, f"{registry.host}/tiny:1")
    pinned = events[0].digest
    assert (
        pull(store, f"{registry.host}/tiny@{pinned}", name="pinned:1")[0].origin["manifest_digest"]
        == pinned
    )
    err = pull_error(store, f"{registry.host}/tiny@sha256:{'0' * 64}")
    assert err.reason == "MANIFEST_UNKNOWN"


def _registry_blob(registry: Registry, digest: str) -> Path:
    hexdigest = digest.partition(":")[2]
    return (
        registry.folder
        / "storage/docker/registry/v2/blobs/sha256"
        / hexdigest[:2]
        / hexdigest
        / "data"
    )


@needs_registry
def test_digest_mismatch_names_the_layer(tmp_path: Path, store: Path, registry: Registry) -> None:
    layout = two_layer_layout(tmp_path)
    registry.push(layout, "1", "tiny")
    manifest_digest = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    manifest = json.loads(
        (layout / "blobs/sha256" / manifest_digest.partition(":")[2]).read_bytes()
    )
    victim = manifest["layers"][1]["digest"]
    blob = _registry_blob(registry, victim)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped: only the digest can tell
    blob.write_bytes(bytes(data))
    err = pull_error(store, f"{registry.host}/tiny:1")
    assert err.reason == "DIGEST_MISMATCH"
    assert "layer 2/2" in err.message and victim in err.message
    assert not ImageStore(store).exists("tiny:1")
    assert not (store / ".blobs/sha256" / victim.partition(":")[2]).exists()
    # The good layer stays, verified, for the next attempt.
    good = manifest["layers"][0]["digest"].partition(":")[2]
    assert (store / ".blobs/sha256" / good).is_file()


def _put(registry: Registry, path: str, data: bytes, content_type: str, method: str = "PUT") -> Any:
    import urllib.request

    req = urllib.request.Request(f"http://{registry.host}/v2/{path}", data=data, method=method)
    req.add_header("Content-Type", content_type)
    return urllib.request.urlopen(req, timeout=10)


def push_raw(
    registry: Registry, repo: str, tag: str, manifest: dict[str, Any], blobs: list[bytes]
) -> None:
    """Push ``blobs`` and ``manifest`` over HTTP (monolithic uploads), for documents skopeo
    would not write."""
    for blob in blobs:
        digest = "sha256:" + hashlib.sha256(blob).hexdigest()
        resp = _put(registry, f"{repo}/blobs/uploads/", b"", "application/octet-stream", "POST")
        location = resp.headers["Location"]
        sep = "&" if "?" in location else "?"
        target = location.split("/v2/", 1)[1] + f"{sep}digest={digest}"
        _put(registry, target, blob, "application/octet-stream")
    _put(registry, f"{repo}/manifests/{tag}", json.dumps(manifest).encode(), manifest["mediaType"])


def _desc(data: bytes, media_type: str) -> dict[str, Any]:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }


@needs_registry
def test_unsupported_media_types(store: Path, registry: Registry) -> None:
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}}).encode()
    layer = gzip.compress(layer_tar(BASE))
    artifact = {
        "schemaVersion": 2,
        "mediaType": manifests.OCI_MANIFEST,
        "config": _desc(b"{}", "application/vnd.example.model+json"),
        "layers": [_desc(layer, manifests.LAYER_TYPES[1])],
    }
    push_raw(registry, "artifact", "1", artifact, [b"{}", layer])
    err = pull_error(store, f"{registry.host}/artifact:1")
    assert (
        err.reason == "UNSUPPORTED_MEDIA_TYPE"
        and "application/vnd.example.model+json" in err.message
    )
    foreign = {
        "schemaVersion": 2,
        "mediaType": manifests.OCI_MANIFEST,
        "config": _desc(config, manifests.CONFIG_TYPES[0]),
        "layers": [_desc(layer, "application/vnd.example.layer.v1.tar+lz4")],
    }
    push_raw(registry, "odd-layer", "1", foreign, [config, layer])
    err = pull_error(store, f"{registry.host}/odd-layer:1")
    assert (
        err.reason == "UNSUPPORTED_MEDIA_TYPE" and "layer 0" in err.message and "lz4" in err.message
    )


def hostile_layer(kind: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(info: tarfile.TarInfo, data: bytes = b"") -> None:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        if kind == "dotdot":
            add(tarfile.TarInfo("../../escaped"), b"x")
        elif kind == "absolute":
            add(tarfile.TarInfo("/tmp/orchard-pull-absolute"), b"x")
        elif kind == "absolute-symlink-then-write":
            link = tarfile.TarInfo("etc")
            link.type, link.linkname = tarfile.SYMTYPE, "/tmp"
            add(link)
            add(tarfile.TarInfo("etc/orchard-pull-through-link"), b"x")
        elif kind == "relative-symlink-then-write":
            link = tarfile.TarInfo("up")
            link.type, link.linkname = tarfile.SYMTYPE, "../../../../../../tmp"
            add(link)
            add(tarfile.TarInfo("up/orchard-pull-through-link"), b"x")
        elif kind == "hardlink-out":
            link = tarfile.TarInfo("passwd")
            link.type, link.linkname = tarfile.LNKTYPE, "/etc/passwd"
            add(link)
        elif kind == "whiteout-dotdot":
            add(tarfile.TarInfo("etc/.wh.."))
    return out.getvalue()


HOSTILE = ["dotdot", "absolute", "absolute-symlink-then-write", "relative-symlink-then-write",
           "hardlink-out", "whiteout-dotdot"]  # fmt: skip


@needs_registry
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_layers_are_refused(
    tmp_path: Path, store: Path, registry: Registry, kind: str
) -> None:
    layout = write_layout(tmp_path / kind, "1", [ImageSpec([layer_tar(BASE), hostile_layer(kind)])])
    registry.push(layout, "1", "evil")
    before = set(os.listdir("/tmp"))
    err = pull_error(store, f"{registry.host}/evil:1")
    assert err.reason == "INVALID_IMAGE" and err.client_fault
    assert "layer 2/2" in err.message
    assert not ImageStore(store).exists("evil:1")
    assert {n for n in set(os.listdir("/tmp")) - before if n.startswith("orchard-pull")} == set()
    assert not (store.parent.parent / "escaped").exists() and not (store / "escaped").exists()
    # Nothing half-unpacked is left (the base layer may be, whole).
    assert [p.name for p in (store / ".layers").iterdir() if p.name.startswith(".tmp")] == []
    assert len(list((store / ".layers").glob("sha256-*"))) <= 1


@needs_registry
def test_device_nodes_are_neutralised(tmp_path: Path, store: Path, registry: Registry) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind in (("dev-sda", tarfile.BLKTYPE), ("dev-mem", tarfile.CHRTYPE)):
            info = tarfile.TarInfo(name)
            info.type, info.devmajor, info.devminor = kind, 1, 1
            tar.addfile(info)
        info = tarfile.TarInfo("setuid-tool")
        info.mode, info.size = 0o4755, 2
        tar.addfile(info, io.BytesIO(b"x\n"))
    registry.push(write_layout(tmp_path / "dev", "1", [ImageSpec([out.getvalue()])]), "1", "dev")
    image, _ = pull(store, f"{registry.host}/dev:1")
    layer = image.layer_paths[0]
    assert sorted(os.listdir(layer)) == ["setuid-tool"]  # the device nodes were skipped


def _layer_manifest(layout: Path) -> dict[str, Any]:
    top = json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]
    return json.loads((layout / "blobs/sha256" / top.partition(":")[2]).read_bytes())


@needs_registry
def test_basic_auth_with_htpasswd(
    tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(auth.CREDENTIALS_ENV, raising=False)
    monkeypatch.delenv(auth.AUTH_FILE_ENV, raising=False)
    with running_registry(
        tmp_path / "reg", htpasswd={"alice": "wonderland"}, creds="alice:wonderland"
    ) as reg:
        reg.push(two_layer_layout(tmp_path), "1", "private")
        ref = f"{reg.host}/private:1"
        err = pull_error(store, ref)
        assert err.reason == "UNAUTHORIZED" and "user name and password" in err.message
        monkeypatch.setenv(auth.CREDENTIALS_ENV, "alice:wrong")
        err = pull_error(store, ref)
        assert err.reason == "UNAUTHORIZED" and "alice" in err.message
        monkeypatch.delenv(auth.CREDENTIALS_ENV)
        auth_file = tmp_path / "auth.json"
        auth_file.write_text(
            json.dumps(
                {"auths": {reg.host: {"auth": base64.b64encode(b"alice:wonderland").decode()}}}
            )
        )
        assert pull(store, ref, auth_file=auth_file)[0].name == "private:1"


@needs_registry
def test_token_auth(tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.AUTH_FILE_ENV, raising=False)
    monkeypatch.delenv(auth.CREDENTIALS_ENV, raising=False)
    tokens = TokenServer(tmp_path, users={"bob": "builder"}, public_repos={"public/tiny"})
    try:
        with running_registry(tmp_path / "reg", token=tokens, creds="bob:builder") as reg:
            reg.push(two_layer_layout(tmp_path), "1", "public/tiny")
            reg.push(two_layer_layout(tmp_path, "2"), "2", "private/tiny")
            # Anonymous where allowed: the token server grants pull on public/ only.
            assert pull(store, f"{reg.host}/public/tiny:1")[0].name == "tiny:1"
            assert tokens.requests[-1]["user"] == ""
            err = pull_error(store, f"{reg.host}/private/tiny:2")
            assert err.reason == "UNAUTHORIZED" and "anonymous" in err.message
            monkeypatch.setenv(auth.CREDENTIALS_ENV, "bob:nope")
            err = pull_error(store, f"{reg.host}/private/tiny:2")
            assert err.reason == "UNAUTHORIZED" and "token server" in err.message
            monkeypatch.setenv(auth.CREDENTIALS_ENV, "bob:builder")
            asked = len(tokens.requests)
            image, _ = pull(store, f"{reg.host}/private/tiny:2", parallel=8)
            assert image.name == "tiny:2"
            # One token for the whole pull, shared by the parallel blob requests.
            assert len(tokens.requests) - asked == 1
            assert tokens.requests[-1]["scopes"] == ["repository:private/tiny:pull"]
    finally:
        tokens.close()


@needs_registry
def test_zstd_layers_over_tls(tmp_path: Path, store: Path) -> None:
    """HTTPS with a private CA (``--ca-file``) and a zstd-compressed layer."""
    layout = write_layout(tmp_path / "z", "1", [ImageSpec([layer_tar(LAYER_1)], zstd_layers=True)])
    with running_registry(tmp_path / "reg", tls=True) as reg:
        reg.push(layout, "1", "zstd")
        ref = f"{reg.host}/zstd:1"
        err = pull_error(store, ref, plain_http=False)
        assert err.reason == "REGISTRY_UNREACHABLE" and "CERTIFICATE_VERIFY_FAILED" in err.message
        image, _ = pull(store, ref, plain_http=False, ca_file=reg.folder / "ca.pem")
    assert (image.layer_paths[0] / "etc/hello").read_text() == "hello\n"
    assert image.origin["layer_digests"][0].startswith("sha256:")


def test_terminal_progress_redraws_one_line_per_layer() -> None:
    import io as _io

    from orchard.scheduler.backends.local.pull.progress import TerminalPrinter, human_bytes

    out = _io.StringIO()
    show = TerminalPrinter(out)
    digest = "sha256:" + "ab" * 32
    show(PullEvent("resolved", ref="r/x:1", layers=2, digest=digest, size=3_000_000, name="x:1"))
    show(PullEvent("layer", layer=1, layers=2, digest=digest, size=2_000_000, status="download"))
    show(PullEvent("layer", layer=2, layers=2, digest=digest, size=1_000_000, status="cached"))
    show(PullEvent("bytes", layer=1, layers=2, digest=digest, size=2_000_000, done=1_000_000))
    text = out.getvalue()
    assert "\x1b[2F" in text  # the two layer lines were rewritten in place
    assert text.rstrip().endswith("layer 2/2 abababababab: already unpacked (1.0 MB)")
    assert "1.0 MB / 2.0 MB [##########..........]" in text
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000_000) == "1.5 GB"


@needs_registry
def test_a_repeated_layer_is_kept_once_at_its_top(store: Path, registry: Registry) -> None:
    """Old manifests repeat layers; overlayfs refuses a lower dir twice (ELOOP)."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}}).encode()
    one, two = gzip.compress(layer_tar(LAYER_1)), gzip.compress(layer_tar(LAYER_2))
    gz = manifests.LAYER_TYPES[1]
    manifest = {
        "schemaVersion": 2,
        "mediaType": manifests.DOCKER_MANIFEST,
        "config": _desc(config, manifests.CONFIG_TYPES[1]),
        "layers": [_desc(one, gz), _desc(two, gz), _desc(one, gz)],
    }
    push_raw(registry, "repeats", "1", manifest, [config, one, two])
    image, _ = pull(store, f"{registry.host}/repeats:1")
    assert [p.resolve().name for p in image.layer_paths] == [
        "sha256-" + hashlib.sha256(two).hexdigest(),
        "sha256-" + hashlib.sha256(one).hexdigest(),
    ]
    with merged_view(image.layer_paths) as merged:
        # The top copy of layer 1 brings back what layer 2 had removed.
        assert (merged / "etc/hello").read_text() == "hello\n"
        assert sorted(os.listdir(merged / "data")) == ["a", "b", "c"]


@needs_registry
def test_a_dead_pulls_half_unpacked_layer_is_removed(
    store: Path, registry: Registry, tmp_path: Path
) -> None:
    registry.push(two_layer_layout(tmp_path), "1", "tiny")
    dead = store / ".layers" / ".tmp-999999999-abc"
    alive = store / ".layers" / f".tmp-{os.getpid()}-abc"
    for folder in (dead, alive):
        (folder / "etc").mkdir(parents=True)
    pull(store, f"{registry.host}/tiny:1")
    assert not dead.exists() and alive.is_dir()


def test_a_full_disk_is_refused_before_downloading(tmp_path: Path) -> None:
    from orchard.scheduler.backends.local.pull.blobs import BlobStore
    from orchard.scheduler.backends.local.pull.pull import _check_space

    huge = manifests.Descriptor(manifests.LAYER_TYPES[1], "sha256:" + "1" * 64, 1 << 60)
    config = manifests.Descriptor(manifests.CONFIG_TYPES[0], "sha256:" + "2" * 64, 10)
    with pytest.raises(PullError) as err:
        _check_space(
            BlobStore(tmp_path / "images"),
            manifests.Manifest("m", config, [huge]),
            tmp_path / "images",
        )
    assert err.value.reason == "INSUFFICIENT_STORAGE" and str((1 << 60) + 10) in err.value.message


@needs_registry
def test_the_uncompressed_layers_must_match_the_configs_diff_ids(
    tmp_path: Path, store: Path, registry: Registry
) -> None:
    one, two = layer_tar(LAYER_1), layer_tar(LAYER_2)
    lying = ["sha256:" + hashlib.sha256(one).hexdigest(), "sha256:" + "f" * 64]
    registry.push(
        write_layout(tmp_path / "lie", "1", [ImageSpec([one, two], diff_ids=lying)]), "1", "lie"
    )
    err = pull_error(store, f"{registry.host}/lie:1")
    assert err.reason == "DIGEST_MISMATCH" and "layer 2/2" in err.message
    assert "the image config says sha256:" + "f" * 64 in err.message
    assert not ImageStore(store).exists("lie:1")
    short = write_layout(tmp_path / "short", "1", [ImageSpec([one, two], diff_ids=lying[:1])])
    registry.push(short, "1", "short")
    err = pull_error(store, f"{registry.host}/short:1")
    assert err.reason == "INVALID_MANIFEST" and "1 diff_ids" in err.message


def _bomb_layer(file_bytes: int, files: int = 1) -> bytes:
    """A layer tar of zeros: ``files`` x ``file_bytes`` unpacked (``write_layout`` gzips it)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(files):
            info = tarfile.TarInfo(f"zeros-{i}")
            info.size = file_bytes
            tar.addfile(info, _Zeros(file_bytes))
    return raw.getvalue()


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


@needs_registry
@pytest.mark.parametrize(
    ("setting", "value", "layer"),
    [
        # 64 MiB of zeros in a blob of a few hundred KiB, against a 16 MiB bound
        ("ORCHARD_IMAGE_MAX_LAYER_BYTES", "16777216", lambda: _bomb_layer(64 << 20)),
        # 300 empty members against a bound of 100
        ("ORCHARD_IMAGE_MAX_LAYER_ENTRIES", "100", lambda: _bomb_layer(0, files=300)),
    ],
)
def test_a_layer_that_expands_beyond_its_bound_is_refused(
    tmp_path: Path,
    store: Path,
    registry: Registry,
    monkeypatch: pytest.MonkeyPatch,
    setting: str,
    value: str,
    layer: Any,
) -> None:
    bomb = layer()
    # small on the wire (as write_layout gzips it): the download's space check cannot see it
    assert len(gzip.compress(bomb, compresslevel=1)) < 1 << 20
    layout = write_layout(tmp_path / "bomb", "1", [ImageSpec([layer_tar(BASE), bomb])])
    registry.push(layout, "1", "bomb")
    monkeypatch.setenv(setting, value)
    err = pull_error(store, f"{registry.host}/bomb:1")
    assert (err.reason, err.client_fault) == ("LAYER_TOO_LARGE", True), err.message
    assert "layer 2/2" in err.message
    assert not ImageStore(store).exists("bomb:1")
    # the half-unpacked layer is gone; what it wrote before the bound is not left on disk
    assert [p.name for p in (store / ".layers").iterdir() if p.name.startswith(".tmp")] == []
    assert tree_bytes(store / ".layers") < 1 << 20
    # the same image pulls under the default bounds
    monkeypatch.delenv(setting)
    image, _ = pull(store, f"{registry.host}/bomb:1")
    assert image.name == "bomb:1"


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
