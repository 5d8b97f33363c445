"""The nginx data-plane proxy against a real stack: every kind of call, refusals, deadlines.

Real ``orchard up --data-plane-proxy nginx`` (real nginx from Debian's package,
runc sandboxes), real gRPC through nginx's port to the node executor, through
the SDK (``ORCHARD_DATA_PLANE=proxy`` finds ``run/data-plane.addr``) and
through raw stubs on an nginx channel, so the wire behaviour is checked too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from orchard.gateway.proxy_nginx import NginxPaths, render_conf

from orchard import Orchard, Sandbox
from orchard._proto.orchard.v1 import executor_pb2, executor_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc
from tests.gateway.data_plane_checks import (
    bearer,
    check_exec_and_streaming_exec,
    check_files_and_tree,
    check_session,
    processes,
    run_request,
    wait_gone,
)
from tests.port_serving import check_http_through_forward
from tests.stack import IMAGES_DIR, REQUIRES_STACK, Stack, running_stack

NEEDS_NGINX = pytest.mark.skipif(shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
                                 reason="needs nginx (make system-deps)")  # fmt: skip


@dataclass
class NginxStack:
    stack: Stack
    data_plane: str
    key: str
    channel: grpc.Channel

    def access(self, sandbox_id: str, api_key: str | None = None) -> sandbox_pb2.ExecutorAccess:
        with grpc.insecure_channel(self.stack.endpoint) as control:
            access: sandbox_pb2.ExecutorAccess = sandbox_pb2_grpc.SandboxServiceStub(
                control
            ).GetExecutorAccess(
                sandbox_pb2.GetSandboxRequest(id=sandbox_id),
                metadata=(("authorization", f"Bearer {api_key or self.key}"),),
            )
        return access

    @property
    def stub(self) -> executor_pb2_grpc.ExecutorServiceStub:
        return executor_pb2_grpc.ExecutorServiceStub(self.channel)


@pytest.fixture(scope="module")
def ngx() -> Iterator[NginxStack]:
    for mark in [*REQUIRES_STACK, NEEDS_NGINX]:
        if mark.name == "skipif" and mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    saved = os.environ.get("ORCHARD_DATA_PLANE_PROXY")
    os.environ["ORCHARD_DATA_PLANE_PROXY"] = "nginx"
    try:
        with tempfile.TemporaryDirectory(prefix="orchard-nginx-") as tmp:
            home = Path(tmp) / "home"
            with running_stack(home) as stack:
                data_plane = (home / "run" / "data-plane.addr").read_text().strip()
                key = (home / "dev-api-key").read_text().strip()
                with grpc.insecure_channel(data_plane) as channel:
                    yield NginxStack(stack, data_plane, key, channel)
    finally:
        if saved is None:
            os.environ.pop("ORCHARD_DATA_PLANE_PROXY", None)
        else:
            os.environ["ORCHARD_DATA_PLANE_PROXY"] = saved


@pytest.fixture(scope="module")
def direct_sb(ngx: NginxStack) -> Iterator[Sandbox]:
    sb = Orchard(ngx.stack.endpoint, ngx.key).sandboxes.create()
    try:
        yield sb
    finally:
        sb.delete()


@pytest.fixture
def proxied(ngx: NginxStack, direct_sb: Sandbox, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    """A handle that finds nginx the way a local user's SDK does: from the home's run/ files."""
    for name in ("ORCHARD_ENDPOINT", "ORCHARD_API_KEY", "ORCHARD_DATA_PLANE_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCHARD_HOME", str(ngx.stack.home))
    monkeypatch.setenv("ORCHARD_DATA_PLANE", "proxy")
    return Sandbox.connect(direct_sb.id)


def test_conf_has_one_fixed_upstream_and_no_client_chosen_target(tmp_path: Path) -> None:
    paths = NginxPaths(tmp_path / "run" / "nginx", tmp_path / "logs")
    conf = render_conf("127.0.0.1:5000", ["127.0.0.1:6000"], paths)
    assert "server 127.0.0.1:6000" in conf and "grpc_pass grpc://orchard_executors;" in conf
    assert "$http_" not in conf  # no upstream taken from a header
    assert "daemon off;" in conf and "master_process off;" in conf
    assert f"pid {paths.pid};" in conf and str(tmp_path / "logs") in conf
    with pytest.raises(ValueError):
        render_conf("127.0.0.1:5000", ["evil; include /etc/passwd:1"], paths)
    with pytest.raises(ValueError):
        render_conf("127.0.0.1:5000", [], paths)
    assert (
        f"location /{executor_pb2.DESCRIPTOR.services_by_name['ExecutorService'].full_name}/ "
        in conf
    )


def test_sdk_finds_nginx_from_the_home(ngx: NginxStack, proxied: Sandbox) -> None:
    _stub, access = proxied._executor()
    assert proxied.client.data_plane_address(access) == ngx.data_plane
    assert ngx.data_plane not in (ngx.stack.endpoint, access.address)


def test_exec_and_streaming_exec_with_stdin(proxied: Sandbox) -> None:
    check_exec_and_streaming_exec(proxied)


def test_session(proxied: Sandbox) -> None:
    check_session(proxied)


def test_files_and_tree(proxied: Sandbox, tmp_path: Path) -> None:
    check_files_and_tree(proxied, tmp_path, os.urandom(6 << 20), files=60)  # 6 MiB: many chunks


def test_forged_missing_and_foreign_tokens_refused(ngx: NginxStack, direct_sb: Sandbox) -> None:
    token = ngx.access(direct_sb.id).token
    assert (
        ngx.stub.Run(run_request(direct_sb.id, "echo", "hi"), metadata=bearer(token)).stdout
        == b"hi\n"
    )
    refusals = {
        "no metadata": (),
        "the API key": bearer(ngx.key),
        "garbage": bearer("not.a.token"),
        "forged signature": bearer(token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB")),
    }
    for why, metadata in refusals.items():
        with pytest.raises(grpc.RpcError) as err:
            ngx.stub.Run(run_request(direct_sb.id, "true"), metadata=metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, why
    # A valid token for this sandbox does not open another one (the executor checks the pair).
    other = Orchard(ngx.stack.endpoint, ngx.key).sandboxes.create()
    try:
        with pytest.raises(grpc.RpcError) as err:
            ngx.stub.Run(run_request(other.id, "true"), metadata=bearer(token))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        other.delete()


def test_only_the_executor_service_is_served(ngx: NginxStack) -> None:
    control = sandbox_pb2_grpc.SandboxServiceStub(ngx.channel)
    with pytest.raises(grpc.RpcError) as err:
        control.GetSandbox(sandbox_pb2.GetSandboxRequest(id="x"), metadata=bearer(ngx.key))
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_deadline_honoured(ngx: NginxStack, direct_sb: Sandbox) -> None:
    token = ngx.access(direct_sb.id).token
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        ngx.stub.Run(
            run_request(direct_sb.id, "sleep", "41.5"), metadata=bearer(token), timeout=0.5
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5
    assert wait_gone(direct_sb, "sleep 41.5", 10), processes(direct_sb)


def test_cancelled_stream_ends_the_command(ngx: NginxStack, direct_sb: Sandbox) -> None:
    token = ngx.access(direct_sb.id).token
    start = executor_pb2.ExecStart(
        sandbox_id=direct_sb.id, argv=["sh", "-c", "echo started; exec sleep 43.5"]
    )
    call = ngx.stub.Exec(iter([executor_pb2.ExecRequest(start=start)]), metadata=bearer(token))
    assert next(call).stdout == b"started\n"
    call.cancel()
    assert wait_gone(direct_sb, "sleep 43.5", 10), processes(direct_sb)


def test_missing_nginx_is_a_clear_error(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHARD_HOME": str(tmp_path / "home"), "ORCHARD_IMAGES_DIR": str(IMAGES_DIR),
           "ORCHARD_NGINX": str(tmp_path / "no-nginx-here")}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "orchard.cli", "up", "--port", "0", "--data-plane-proxy", "nginx"],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode != 0
    assert "nginx" in result.stderr and "--data-plane-proxy python" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "home" / "logs" / "executor.log").exists()  # nothing was started


def test_sdk_config_reads_the_data_plane_file_only_from_its_own_home(tmp_path: Path) -> None:
    from orchard.client._config import ClientConfig

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "gateway.addr").write_text("127.0.0.1:1\n")
    (tmp_path / "run" / "data-plane.addr").write_text("127.0.0.1:2\n")
    home = {"ORCHARD_HOME": str(tmp_path), "ORCHARD_API_KEY": "k", "ORCHARD_DATA_PLANE": "proxy"}
    assert ClientConfig.resolve(environ=home).data_plane_endpoint == "127.0.0.1:2"
    # An endpoint named elsewhere is another stack: this home's nginx is not its data plane.
    assert (
        ClientConfig.resolve(environ={**home, "ORCHARD_ENDPOINT": "gw:9"}).data_plane_endpoint
        is None
    )
    assert ClientConfig.resolve(environ=home, endpoint="gw:9").data_plane_endpoint is None
    named = {**home, "ORCHARD_ENDPOINT": "gw:9", "ORCHARD_DATA_PLANE_ENDPOINT": "dp:7"}
    assert ClientConfig.resolve(environ=named).data_plane_endpoint == "dp:7"
    (tmp_path / "run" / "data-plane.addr").unlink()
    assert ClientConfig.resolve(environ=home).data_plane_endpoint is None


def test_killed_nginx_is_restarted_on_the_same_address(ngx: NginxStack, direct_sb: Sandbox) -> None:
    pid_file = ngx.stack.home / "run" / "nginx" / "nginx.pid"
    old_pid = int(pid_file.read_text())
    os.kill(old_pid, 9)  # nginx's master, started by this test's stack
    token = ngx.access(direct_sb.id).token
    deadline = time.monotonic() + 30
    while True:
        try:
            with grpc.insecure_channel(ngx.data_plane) as channel:
                stub = executor_pb2_grpc.ExecutorServiceStub(channel)
                got = stub.Run(
                    run_request(direct_sb.id, "echo", "back"), metadata=bearer(token), timeout=5
                )
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "nginx was not restarted within 30 s"
            time.sleep(0.2)
    assert got.stdout == b"back\n"
    assert int(pid_file.read_text()) != old_pid
    assert (ngx.stack.home / "run" / "data-plane.addr").read_text().strip() == ngx.data_plane


def test_unknown_proxy_kind_in_the_environment_is_refused(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ORCHARD_HOME": str(tmp_path / "home"),
        "ORCHARD_DATA_PLANE_PROXY": "envoy",
    }
    result = subprocess.run(
        [sys.executable, "-m", "orchard.cli", "up", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode != 0
    assert "'envoy'" in result.stderr and "ORCHARD_DATA_PLANE_PROXY" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_forward_through_nginx(proxied: Sandbox) -> None:
    """ConnectPort's bidirectional streams pass nginx's grpc_pass like exec's."""

    proxied.write_file("/srv/n.txt", "through nginx\n")
    check_http_through_forward(proxied, "n.txt", b"through nginx\n", fetches=24, threads=8)
