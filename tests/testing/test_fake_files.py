"""File calls of the fake are confined to the sandbox's directory: attacks by ``..``,
symlinks and hostile tar members stay inside (or are refused with the real reasons)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import grpc
import pytest

from orchard import InvalidRequestError, Orchard, PathError, PathEscapeError, PathNotFoundError
from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc
from orchard.testing import FakeImage, FakeOrchard


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    return info


def _upload(
    fake: FakeOrchard, sandbox_id: str, dest: str, data: bytes
) -> executor_pb2.UploadResponse:
    token = fake.world.issue_token(sandbox_id)[0]
    stub = executor_pb2_grpc.ExecutorServiceStub(fake.transport().channel(fake.executor_endpoint))
    requests = iter(
        [
            executor_pb2.UploadRequest(
                header=executor_pb2.UploadHeader(sandbox_id=sandbox_id, path=dest)
            ),
            executor_pb2.UploadRequest(data=data),
        ]
    )
    return stub.Upload(requests, metadata=(("authorization", f"Bearer {token}"),))


def _reason(err: grpc.RpcError) -> str:
    return dict(err.trailing_metadata())["orchard-reason"]  # type: ignore[attr-defined]


def test_write_read_modes_and_parents(fake: FakeOrchard, client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        assert sb.write_file("/deep/er/file.sh", "#!/bin/sh\necho ran\n", mode=0o755) == 19
        assert sb.exec("./file.sh", cwd="/deep/er").stdout == b"ran\n"
        with pytest.raises(PathNotFoundError):
            sb.write_file("/nope/file", "x", make_parents=False)
        with pytest.raises(PathError):
            sb.write_file("/deep", "x")  # a directory
        with pytest.raises(PathError):
            sb.read_file("/deep")
        big = os.urandom(3 << 20)
        sb.write_file("/big.bin", io.BytesIO(big))
        assert sb.read_file("/big.bin") == big
        with pytest.raises(InvalidRequestError):
            sb.write_file("/m", "x", mode=0o170000)


def test_dotdot_and_symlinks_cannot_escape(
    fake: FakeOrchard, client: Orchard, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    with client.sandboxes.create() as sb:
        root = fake.root(sb.id)
        with pytest.raises(PathEscapeError):
            sb.read_file("/work/../../etc/passwd")
        # Links planted by a command resolve inside the sandbox, as the sandbox sees them.
        os.symlink(str(secret), root / "abs-link")
        os.symlink("../../../../../../" + str(secret), root / "rel-link")
        os.symlink("/", root / "rootlink")
        for name in ("abs-link", "rel-link"):
            with pytest.raises(PathNotFoundError):
                sb.read_file(f"/{name}")
        with pytest.raises(PathNotFoundError):
            sb.read_file(f"/rootlink{secret}")
        sb.write_file("/abs-link", "replaced")  # replaces the link, never writes through it
        assert secret.read_text() == "host only"
        assert sb.read_file("/abs-link") == b"replaced"
        os.symlink(str(tmp_path), root / "dirlink")
        with pytest.raises(PathError):  # dangling in-root: never created through (FILE_EXISTS)
            sb.write_file("/dirlink/planted", "x")
        (root / tmp_path.relative_to("/")).mkdir(parents=True)
        sb.write_file("/dirlink/planted", "x")  # lands in the sandbox's own copy of the path
        assert not (tmp_path / "planted").exists()
        assert (root / tmp_path.relative_to("/") / "planted").read_text() == "x"
        os.symlink("loop2", root / "loop1")
        os.symlink("loop1", root / "loop2")
        with pytest.raises(PathEscapeError):
            sb.read_file("/loop1")


def test_tar_round_trip_keeps_modes_links_and_binary(client: Orchard, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "run.sh").write_bytes(b"#!/bin/sh\n")
    (src / "a" / "b" / "run.sh").chmod(0o750)
    (src / "blob").write_bytes(bytes(range(256)) * 100)
    (src / "a" / "ln").symlink_to("b/run.sh")
    with client.sandboxes.create() as sb:
        assert sb.upload(src, "/dst") == (3, 10 + 25600)
        out = tmp_path / "out"
        out.mkdir()
        result = sb.download("/dst", out)
        assert result.members >= 5
        assert (out / "blob").read_bytes() == bytes(range(256)) * 100
        assert (out / "a" / "b" / "run.sh").stat().st_mode & 0o777 == 0o750
        assert os.readlink(out / "a" / "ln") == "b/run.sh"
        single = tmp_path / "single"
        single.mkdir()
        sb.download("/dst/blob", single)
        assert (single / "blob").read_bytes() == bytes(range(256)) * 100
        with pytest.raises(PathNotFoundError):
            sb.download("/missing", single)


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        (_member("/etc/evil"), "PATH_ESCAPE"),
        (_member("../evil"), "PATH_ESCAPE"),
        (_member("a/../../evil"), "PATH_ESCAPE"),
        (_member("ln", tarfile.SYMTYPE, "/etc/passwd"), "PATH_ESCAPE"),
        (_member("ln", tarfile.SYMTYPE, "../../outside"), "PATH_ESCAPE"),
        (_member("hard", tarfile.LNKTYPE, "../outside"), "PATH_ESCAPE"),
        (_member("dev", tarfile.CHRTYPE), "UNSUPPORTED_FILE_TYPE"),
        (_member("fifo", tarfile.FIFOTYPE), "UNSUPPORTED_FILE_TYPE"),
    ],
)
def test_hostile_tar_members_are_refused(
    fake: FakeOrchard, client: Orchard, member: tarfile.TarInfo, reason: str
) -> None:
    with client.sandboxes.create() as sb:
        data = (
            None
            if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE)
            else b"x"
        )
        with pytest.raises(grpc.RpcError) as info:
            _upload(fake, sb.id, "/up", _tar((member, data)))
        assert _reason(info.value) == reason
        base = fake.world.base_dir
        assert sorted(p.name for p in base.iterdir()) == [sb.id]  # nothing landed beside it


def test_a_planted_symlink_cannot_redirect_a_later_member(
    fake: FakeOrchard, client: Orchard, tmp_path: Path
) -> None:
    with client.sandboxes.create() as sb:
        root = fake.root(sb.id)
        (root / "up").mkdir()
        os.symlink(str(tmp_path), root / "up" / "out")  # absolute: refused below the destination
        with pytest.raises(grpc.RpcError) as absolute:
            _upload(fake, sb.id, "/up", _tar((_member("out/file"), b"data")))
        assert _reason(absolute.value) == "PATH_ESCAPE"
        assert not (tmp_path / "file").exists()
        os.symlink("sub", root / "up" / "inside")
        _upload(
            fake,
            sb.id,
            "/up",
            _tar((_member("sub/", tarfile.DIRTYPE), None), (_member("inside/f"), b"ok")),
        )
        assert (root / "up" / "sub" / "f").read_bytes() == b"ok"
        os.symlink("../..", root / "up" / "climb")
        with pytest.raises(grpc.RpcError) as info:
            _upload(fake, sb.id, "/up/inner", _tar((_member("../climb/x"), b"data")))
        assert _reason(info.value) == "PATH_ESCAPE"


def test_malformed_and_empty_tar_streams(fake: FakeOrchard, client: Orchard) -> None:
    with client.sandboxes.create() as sb:
        assert _upload(fake, sb.id, "/empty", b"").files == 0
        assert (fake.root(sb.id) / "empty").is_dir()
        with pytest.raises(grpc.RpcError) as info:
            _upload(fake, sb.id, "/bad", b"not a tar stream at all" * 40)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_image_files_seed_each_new_sandbox(tmp_path: Path) -> None:
    image = FakeImage(
        "tools", files={"/etc/os-release": "ID=fake\n", "/bin/tool": b"\x7fELF"}, is_default=True
    )
    with (
        FakeOrchard(images=[image], base_dir=tmp_path) as fake,
        fake.client() as client,
        client.sandboxes.create() as sb,
    ):
        assert sb.read_file("/etc/os-release") == b"ID=fake\n"
        assert sb.last_info.image == "tools"


def test_file_operations_on_the_fake(client: Orchard, tmp_path: Path) -> None:
    """list/stat/exists/remove/rename/make_dir answer as the real executor does (the
    same answers are pinned against a real stack in tests/e2e/test_fake_parity.py)."""
    with client.sandboxes.create() as sb:
        assert sb.make_dir("/w/sub", mode=0o700) and not sb.make_dir("/w/sub")
        sb.write_file("/w/f", "abc")
        entries = sb.list_dir("/w", depth=2)
        assert [(e.path, e.type, e.size if e.is_file else 0) for e in entries] == [
            ("/w/f", "file", 3),
            ("/w/sub", "dir", 0),
        ]
        assert sb.stat("/w/sub").mode == 0o700 and sb.exists("/w/f")
        sb.rename("/w/f", "/w/sub/g")
        with pytest.raises(FileNotFoundError):
            sb.stat("/w/f")
        with pytest.raises(IsADirectoryError):
            sb.remove("/w")
        assert sb.remove("/w", recursive=True) == 3
        with pytest.raises(PathEscapeError):
            sb.list_dir("/../..")
        with pytest.raises(FileExistsError):
            sb.make_dir("/", exist_ok=False)
