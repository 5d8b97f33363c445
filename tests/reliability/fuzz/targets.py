"""Coverage-guided fuzz targets (atheris) for Orchard's own parsers of hostile bytes.

Each target feeds fuzzer bytes to one parser and allows exactly the refusal
that parser documents; any other exception, or a result that breaks the
parser's promise, is a finding (atheris stops and writes the crashing input
as ``crash-<sha1>`` in the working directory).

- ``tar``: the executor's streaming tar reader (Upload): members and their
  data; only INVALID_ARGUMENT "malformed tar stream" may escape, and a
  member's data never exceeds its declared size.
- ``paths``: path cleaning (every file API) and tar member names and symlink
  targets: cleaned parts never contain ``..``, ``.``, ``/`` or an empty part,
  and a refusal is always INVALID_ARGUMENT.
- ``token``: executor token verification: random tokens, and mutations of a
  valid one, never verify for another sandbox; only TokenError escapes.
- ``revocation``: the executor's ``Revoke`` step (``CallAuthorizer.revoke``) in an
  injected executor holding one sandbox's keys: random notices, mutations of a
  valid one and random sandbox ids; only UNAUTHENTICATED ``REVOCATION_INVALID``
  (or INVALID_ARGUMENT for a bad id) escapes, and nothing but the valid notice for
  its own sandbox changes what the executor has revoked.
- ``key-drop``: the same step for key-drop notices (``CallAuthorizer.drop_key``) in an
  injected executor holding two key ids: random notices, mutations of a valid one
  and random sandbox ids; only ``REVOCATION_INVALID`` (or a bad id) escapes, and
  nothing but the valid notice for its own sandbox removes a key.
- ``rest``: the REST facade's JSON -> proto step for every request type it
  serves; only RestError INVALID_ARGUMENT escapes.
- ``init``: the Python side of the orchard-init protocol: answer decoders and
  the request encoder; only ProtocolError / ValueError escape, and an
  encoded request always carries its own length.

Run one: ``.venv/bin/python -m tests.reliability.fuzz.targets tar -runs=50000
-max_total_time=30`` (libFuzzer flags after the name). ``make fuzz`` runs all.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tarfile
import types
from collections.abc import Callable
from pathlib import Path

import atheris
from google.protobuf import message_factory
from orchard.executor import auth, init_protocol
from orchard.executor.files import paths, tarreader
from orchard.gateway import rest

from orchard._proto.orchard.v1 import executor_pb2, pools_pb2, rewards_pb2, sandbox_pb2
from orchard.common import tokens
from orchard.common.errors import ServiceError
from orchard.common.tokens import Keyring, TokenError, TokenSigner, TokenVerifier

# Our modules load through the editable install's package-tree loader, which atheris's
# import hook does not see (it instrumented nothing of ours): instrument their code directly.
FUZZED_MODULES = (tarreader, paths, tokens, rest, init_protocol, auth)


def _instrument(module: types.ModuleType) -> None:
    for value in list(vars(module).values()):
        functions = [value] if isinstance(value, types.FunctionType) else []
        if isinstance(value, type):
            functions = [f for f in vars(value).values() if isinstance(f, types.FunctionType)]
        for function in functions:
            if function.__module__ == module.__name__:
                atheris.instrument_func(function)


KEY = b"k" * 32
SIGNER = TokenSigner.from_key(KEY)
VALID, _ = SIGNER.issue("sb-fuzz", 3600, now=1_000_000.0, tenant="t", max_execs=3)
NOTICE_NOW = 1_000_000.0
VALID_NOTICE = SIGNER.sign_revocation("sb-fuzz", "t", NOTICE_NOW - 1)
TWO_KEYS = TokenSigner(Keyring({"k1": KEY, "k2": b"j" * 32}, "k2"))
VALID_DROP = TWO_KEYS.sign_key_drop("sb-fuzz", "k2", created=NOTICE_NOW)
REQUEST_TYPES = [
    message_factory.GetMessageClass(method.input_type)
    for module in (sandbox_pb2, executor_pb2, pools_pb2, rewards_pb2)
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


def _refused(err: ServiceError, *reasons: str) -> None:
    if err.code.name != "INVALID_ARGUMENT" or (reasons and err.reason not in reasons):
        raise AssertionError(f"unexpected refusal {err.code} {err.reason}: {err.message}")


def fuzz_tar(data: bytes) -> None:
    reader = tarreader.TarReader(io.BytesIO(data), read_size=1 + data[0] % 700 if data else 1)
    try:
        for _ in range(10_000):
            member = reader.next()
            if member is None:
                return
            got = sum(len(piece) for piece in reader.data())
            if got != member.size:
                raise AssertionError(f"member {member.name!r}: {got} bytes for size {member.size}")
    except ServiceError as err:
        _refused(err)
        if "malformed tar stream" not in err.message and "tar" not in err.message:
            raise AssertionError(f"refusal without a tar message: {err.message}") from err


def _check_parts(parts: tuple[str, ...]) -> None:
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise AssertionError(f"uncleaned part {part!r} in {parts!r}")


def fuzz_paths(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    path = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 300))
    target = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 300))
    try:
        _check_parts(paths.parse_sandbox_path(path).parts)
    except ServiceError as err:
        _refused(err)
    try:
        member = paths.parse_member_name(path, "/dest")
        _check_parts(member)
        if path.startswith("/"):
            raise AssertionError(f"absolute member name {path!r} accepted")
    except ServiceError as err:
        _refused(err)
        return
    if not member:
        return
    try:
        paths.check_link_target(target, member, "/dest", path)
        if target.startswith("/"):
            raise AssertionError(f"absolute link target {target!r} accepted")
    except ServiceError as err:
        _refused(err)


def fuzz_token(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    how = fdp.ConsumeIntInRange(0, 2)
    if how == 0:
        token = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 400))
    else:  # a valid token with bytes flipped, cut or added
        raw = bytearray(VALID.encode())
        for _ in range(fdp.ConsumeIntInRange(1, 4)):
            if raw:
                raw[fdp.ConsumeIntInRange(0, len(raw) - 1)] = fdp.ConsumeIntInRange(32, 126)
        if how == 2:
            raw = raw[: fdp.ConsumeIntInRange(0, len(raw))] + fdp.ConsumeBytes(8)
        token = raw.decode("latin-1")
    sandbox = "sb-fuzz" if fdp.ConsumeBool() else "sb-other"
    try:
        claims = SIGNER.verify(token, sandbox, now=1_000_000.0)
    except TokenError:
        return
    if token != VALID or claims.sandbox_id != sandbox:
        raise AssertionError(f"forged token accepted: {token!r} for {sandbox}")


def _notice_and_sandbox(data: bytes, valid: str) -> tuple[str, str]:
    """Random text, or ``valid`` with bytes flipped, cut or added; and a sandbox id."""
    fdp = atheris.FuzzedDataProvider(data)
    how = fdp.ConsumeIntInRange(0, 2)
    if how == 0:
        notice = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 1200))
    else:
        raw = bytearray(valid.encode())
        for _ in range(fdp.ConsumeIntInRange(1, 4)):
            raw[fdp.ConsumeIntInRange(0, len(raw) - 1)] = fdp.ConsumeIntInRange(32, 126)
        if how == 2:
            raw = raw[: fdp.ConsumeIntInRange(0, len(raw))] + fdp.ConsumeBytes(8)
        notice = raw.decode("latin-1")
    sandbox = ("sb-fuzz", "sb-other", fdp.ConsumeUnicodeNoSurrogates(12))[
        fdp.ConsumeIntInRange(0, 2)
    ]
    return notice, sandbox


def _allowed_refusal(err: ServiceError) -> None:
    if (err.code.name, err.reason) not in (
        ("UNAUTHENTICATED", "REVOCATION_INVALID"),
        ("INVALID_ARGUMENT", "INVALID_FIELD"),
    ):
        raise AssertionError(f"unexpected refusal {err.code} {err.reason}: {err.message}") from err


def fuzz_key_drop(data: bytes) -> None:
    notice, sandbox = _notice_and_sandbox(data, VALID_DROP)
    keys = TWO_KEYS.sandbox_keys_for("sb-fuzz")
    verifier = TokenVerifier.for_sandbox("sb-fuzz", keys)
    authorizer = auth.CallAuthorizer(verifier, clock=lambda: NOTICE_NOW)
    try:
        authorizer.drop_key(sandbox, notice)
    except ServiceError as err:
        _allowed_refusal(err)
        if dict(verifier.sandbox_keys) != keys:
            raise AssertionError(f"a refused notice removed a key: {notice!r}") from err
        return
    if notice != VALID_DROP or sandbox != "sb-fuzz" or set(verifier.sandbox_keys) != {"k1"}:
        raise AssertionError(f"forged key-drop notice accepted: {notice!r} for {sandbox!r}")


def fuzz_revocation(data: bytes) -> None:
    notice, sandbox = _notice_and_sandbox(data, VALID_NOTICE)
    verifier = TokenVerifier.for_sandbox("sb-fuzz", SIGNER.sandbox_keys_for("sb-fuzz"))
    authorizer = auth.CallAuthorizer(verifier, clock=lambda: NOTICE_NOW)
    try:
        authorizer.revoke(sandbox, notice)
    except ServiceError as err:
        _allowed_refusal(err)
        if verifier.revocations.table():
            raise AssertionError(f"a refused notice changed the revocations: {notice!r}") from err
        return
    if notice != VALID_NOTICE or sandbox != "sb-fuzz":
        raise AssertionError(f"forged notice accepted: {notice!r} for {sandbox!r}")


def fuzz_rest(data: bytes) -> None:
    if not data:
        return
    cls = REQUEST_TYPES[data[0] % len(REQUEST_TYPES)]
    try:
        message = rest.parse_body(data[1:], cls)
    except rest.RestError as err:
        if err.code.name != "INVALID_ARGUMENT" or not err.message:
            raise AssertionError(f"unexpected REST error {err}") from err
        return
    rest.sandbox_id_in(message)
    message.SerializeToString()


def fuzz_init(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    answer = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24))
    for decode in (
        init_protocol.decode_error,
        init_protocol.decode_pid,
        init_protocol.decode_exit,
        init_protocol.decode_kill_all,
    ):
        with contextlib.suppress(init_protocol.ProtocolError):
            decode(answer)
    strings = [
        fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 40)) for _ in range(fdp.ConsumeIntInRange(0, 6))
    ]
    try:
        request = init_protocol.InitRequest(
            argv=tuple(strings[:3]),
            env=tuple(strings[3:]),
            cwd=fdp.ConsumeUnicode(8),
            uid=fdp.ConsumeIntInRange(-2, 0x1_0000_0001),
            gid=fdp.ConsumeIntInRange(-2, 0x1_0000_0001),
            timeout_ms=fdp.ConsumeIntInRange(-5, 1 << 40),
            stdin=fdp.ConsumeBool(),
            inline_output=fdp.ConsumeBool(),
            pty=(
                (fdp.ConsumeIntInRange(-1, 70000), fdp.ConsumeIntInRange(-1, 70000))
                if fdp.ConsumeBool()
                else None
            ),
        )
        encoded = init_protocol.encode_request(request)
    except ValueError:
        return
    if int.from_bytes(encoded[:4], "little") != len(encoded) - 4:
        raise AssertionError("length prefix does not match the request")
    if fdp.ConsumeBool():
        with contextlib.suppress(ValueError):
            init_protocol.kill_all_request(
                fdp.ConsumeIntInRange(-3, 70), fdp.ConsumeIntInRange(-3, 9)
            )


def _tar_seeds() -> Path:
    """A corpus folder of small real archives (regular, folder, symlink, hard link, fifo,
    PAX long name, GNU long name, global PAX record), made by tarfile."""
    folder = Path("corpus-tar")
    folder.mkdir(exist_ok=True)
    members = [
        ("a.txt", tarfile.REGTYPE, b"hello"),
        ("dir", tarfile.DIRTYPE, b""),
        ("link", tarfile.SYMTYPE, b""),
        ("hard", tarfile.LNKTYPE, b""),
        ("fifo", tarfile.FIFOTYPE, b""),
        ("d/" + "n" * 150, tarfile.REGTYPE, b"x" * 600),
    ]
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fmt, pax_headers={"comment": "g"}) as tar:
            for name, kind, data in members:
                if fmt == tarfile.USTAR_FORMAT and len(name) > 100:
                    continue
                info = tarfile.TarInfo(name)
                info.type, info.size = kind, len(data)
                info.linkname = "a.txt" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
                tar.addfile(info, io.BytesIO(data) if data else None)
        (folder / f"seed-{fmt}").write_bytes(out.getvalue())
    return folder


TARGETS: dict[str, Callable[[bytes], None]] = {
    "tar": fuzz_tar,
    "paths": fuzz_paths,
    "token": fuzz_token,
    "revocation": fuzz_revocation,
    "key-drop": fuzz_key_drop,
    "rest": fuzz_rest,
    "init": fuzz_init,
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: targets.py {{{'|'.join(TARGETS)}}} [libFuzzer flags]")
    target = TARGETS[sys.argv[1]]
    for module in FUZZED_MODULES:
        _instrument(module)
    args = [sys.argv[0], *sys.argv[2:]]
    if sys.argv[1] == "tar":  # seeds: a checksum is hard to guess, real headers are not
        args.append(str(_tar_seeds()))
    atheris.Setup(args, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
