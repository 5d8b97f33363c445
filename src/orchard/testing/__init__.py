"""An in-process fake of Orchard, for unit tests of code written on the SDK.

::

    from orchard.testing import FakeOrchard

    with FakeOrchard() as fake, fake.client() as client:
        with client.sandboxes.create() as sb:
            sb.write_file("/work/a.py", "print(1)")
            assert sb.exec("python3 a.py", cwd="/work").stdout_text == "1\\n"

``fake.transport()`` / ``fake.async_transport()`` (both take ``interceptors=``,
sync or grpc.aio ones) are transports for
``Orchard(transport=...)`` / ``AsyncOrchard(transport=...)`` (httpx's
``MockTransport`` idea): the SDK runs unchanged, its stubs are built over
channels (``grpc.Channel`` / ``grpc.aio.Channel`` subclasses) that route each
full method path to in-process servicers implementing the real protos. Every
message goes through the real protobuf serializers, and errors come back as
real ``grpc.RpcError`` / ``grpc.aio.AioRpcError`` with the ``orchard-reason``
and ``orchard-fault`` trailers the real services send, so the SDK raises its
usual exceptions (``SandboxNotFoundError``, ``PathEscapeError``,
``AuthenticationError`` ...).

What the fake does (honestly):

- **Control plane**: sandboxes are records in memory. Create validates like
  the real scheduler (image name and existence, resources and ttl bounds,
  labels, env names, request_id, template rules) and honours ``request_id``
  idempotency; get/list(labels)/delete (idempotent)/keepalive; network policy
  updates are validated and recorded (``fake.network_policy(id)``), never
  enforced. Templates are answered by the PoolService; a template create is a
  cold create (no warm pool). API keys per tenant (a wrong key is
  UNAUTHENTICATED / API_KEY_INVALID; another tenant's sandbox is NOT_FOUND).
  ``GetExecutorAccess`` returns the fake executor's address and a
  per-sandbox token, which the data plane checks.
- **Files**: each sandbox is a fresh temporary directory on the host, used
  as its ``/`` for file calls (read, write with mode and make_parents,
  upload/download as tar streams). Paths are confined to it: ``..`` above
  ``/`` is refused (PATH_ESCAPE), symlinks resolve inside the directory the
  way the sandbox would see them (an absolute link target starts again at
  the sandbox's ``/``), tar members with absolute names, climbing names or
  escaping link targets are refused. The directory starts empty (plus a
  :class:`FakeImage`'s ``files``): it is not the image's file system.
- **Commands** run as real host subprocesses of the current user, with cwd
  mapped into the sandbox's directory, env = a standard ``PATH`` (the host's
  programs), ``HOME`` = the sandbox's directory, the sandbox's env, then the
  request's (nothing else of the test process's env); per-call timeouts kill
  the process group (``timed_out``), output caps
  (``truncated``), exit codes and signals, stdin streams, persistent bash
  sessions (cwd, variables, functions persist; interrupt) and KillAll over
  the commands the fake started.

What the fake does NOT isolate or enforce:

- Commands are not sandboxed at all: they see the host's file system,
  network and processes, and can do anything the current user can. Absolute
  paths inside command strings (``cat /etc/passwd``) are the host's, not
  remapped; only ``cwd`` and the file calls are. ``user=`` is looked up in
  the sandbox directory's own ``etc/passwd`` (``root`` always exists) and
  sets ``USER``/``HOME``, but commands still run as the current user.
- No resource limits (cpu, memory, pids are recorded only; ``oom_killed``
  is never set by a real command), no network policy, no quotas, no TTL
  reaping, no warm pools; images are names (plus seed files), not root file
  systems. A process that leaves its process group (``setsid``) escapes
  KillAll and delete. No message size limits; argv and environment are checked
  by the kernel's execve rule with the host's stack limit. A named file
  ``owner`` is checked against the sandbox's ``etc/passwd`` but only applied
  when the fake runs as root. The rewards service is not faked. Tokens are
  random ids, not signed: ``Revoke`` (the scheduler's call to its nodes, never
  the SDK's) refuses every notice with ``REVOCATION_INVALID``.

Failures are injected with ``fake.fail_next("Run")`` (an infrastructure
failure by default) and ``fake.reap(sandbox_id)`` (the server deleted it).

For unit tests that must not run anything on the host, script the results:
``fake.on_exec("pytest -q", ScriptedResult(stdout="1 passed", exit_code=0))``,
and pass ``FakeOrchard(run_commands=False)`` so an unscripted command is
refused instead of run. ``fake.exec_calls`` records every command asked for.
See ``docs/testing.md``.
"""

from ._fake import (
    DEFAULT_API_KEY,
    EXECUTOR_ADDRESS,
    GATEWAY_ADDRESS,
    AsyncFakeTransport,
    FakeOrchard,
    FakeTransport,
)
from ._scripts import ExecCall, ScriptedResult
from ._world import FakeImage, FakeTemplate, SandboxRecord

__all__ = [
    "DEFAULT_API_KEY",
    "EXECUTOR_ADDRESS",
    "GATEWAY_ADDRESS",
    "AsyncFakeTransport",
    "ExecCall",
    "FakeImage",
    "FakeOrchard",
    "FakeTemplate",
    "FakeTransport",
    "SandboxRecord",
    "ScriptedResult",
]
