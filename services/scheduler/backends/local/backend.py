"""``LocalBackend``: the ``Backend`` interface over runc, overlayfs and cgroups on one node.

create = claim ``sandboxes/<id>/``, mount the overlay root, write config.json,
bind the init socket, ``runc run --detach`` with the socket as fd 3, write
sandbox.json. delete = SIGKILL the init through a pidfd (its pid namespace
dies with it), unmount, rmdir the cgroups, drop runc's state dir and the
folder, without running ``runc delete`` unless the init will not die; it is idempotent and also undoes a create that died half-way.
list/inspect read what exists (sandbox folders and runc's state dir), so a
scheduler restarted after kill -9 sees every sandbox it left behind.

All blocking work (syscalls, runc) runs in the backend's own thread pool, and
a semaphore (cores * 4 by default) bounds how many creates and deletes run at
once so a burst of 1000 creates queues instead of starving the machine.
Operations on one sandbox id are serialised.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import functools
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog

from orchard.common.layout import NodeLayout, SandboxLayout, SandboxMeta
from orchard.common.tokens import derive_sandbox_key, encode_sandbox_keys

from ..base import (
    CHECK_RUNTIME_CLASS,
    CLOSE,
    MODEL_ENDPOINT,
    MODEL_ENDPOINT_BASE,
    MODEL_ENDPOINT_ENV,
    REPORT_FAILURES,
    UPDATE_ENV,
    UPDATE_NETWORK,
    BackendError,
    BackendSandbox,
    Capability,
    ImageInfo,
    SandboxSpec,
    check_sandbox_id,
    valid_sandbox_id,
)
from ..netpolicy.policy import NetworkPolicySpec
from . import (
    cgroups,
    init_socket,
    injected,
    model_endpoint,
    oci_config,
    overlay,
    run_folder,
    scratch,
    slots,
    userns,
)
from .images import (
    ImageStore,
    StoredImage,
    image_env_defaults,
    normalize_image_name,
)
from .init_watch import InitWatch
from .injected import InjectedRuntime, check_bundle
from .model_endpoint import ModelEndpoints
from .network import SandboxNetworking, tenant_key
from .runc import ContainerState, Runc, kill_and_wait
from .runsc import Runsc
from .settings import (
    LOCAL_RUNTIME_CLASSES,
    RUNTIME_INJECTED,
    RUNTIME_RUNC,
    RUNTIME_RUNSC,
    LocalSettings,
)
from .tools_mount import tool_layer_mount

T = TypeVar("T")

log = structlog.get_logger("orchard.scheduler.local")

PID_FILE = "init.pid"
LOG_FILE = "init.log"


@dataclass
class _IdLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class LocalBackend:
    """Sandboxes as runc containers on this machine."""

    name = "local"
    capabilities: frozenset[Capability[Any]] = frozenset(
        {UPDATE_ENV, UPDATE_NETWORK, REPORT_FAILURES, CHECK_RUNTIME_CLASS, MODEL_ENDPOINT, CLOSE}
    )

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self.layout = NodeLayout(settings.home)
        self.store = ImageStore(settings.image_store_dir)
        self.runc = Runc(settings.runc, settings.runc_root)
        self.runsc = Runsc(settings.runsc, settings.runsc_root)
        self._pool = ThreadPoolExecutor(
            max_workers=settings.max_parallel + 2, thread_name_prefix="orchard-local"
        )
        self._slots = slots.PrioritySlots(settings.max_parallel)
        self._id_locks: dict[str, _IdLock] = {}
        self._image_cache: dict[str, tuple[int, StoredImage]] = {}
        self._init_binary: Path | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.network = SandboxNetworking(settings.network, self.layout)
        self.model_endpoints = ModelEndpoints(settings.model_endpoint, self.layout.run)
        self._endpoints_adopted = False
        self._init_watch = InitWatch(self._container_state)
        for folder in (self.layout.sandboxes, settings.runc_root):
            folder.mkdir(parents=True, exist_ok=True)
        self.writable_layer = scratch.choose(
            settings.sandbox_disk_bytes, settings.scratch_mount, self.layout.sandboxes
        )
        self.writable_layer.write(self.layout.run)
        _log_writable_layer(self.writable_layer)
        self.uid_ranges: userns.UidRanges | None = None
        if settings.userns:
            self.uid_ranges = self._uid_ranges()
            _log_userns(settings)

    # -- Backend interface -------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> BackendSandbox:
        check_sandbox_id(spec.sandbox_id)
        if spec.network_mode != spec.network.mode:
            raise BackendError.invalid(
                f"network mode {spec.network_mode!r} does not match the policy's "
                f"{spec.network.mode!r} (modes: none, allowlist, internet)",
                reason="UNSUPPORTED",
            )
        if spec.cpu_millis <= 0 or spec.memory_bytes <= 0 or spec.pids <= 0:
            raise BackendError.invalid("cpu, memory and pids limits must be positive")
        try:
            oci_config.tenant_group(spec.tenant)
        except ValueError as err:
            raise BackendError.invalid(str(err)) from None
        self._bundle_for(spec.runtime_class)  # refuses an unknown or unusable class
        if (
            self.uid_ranges is not None
            and self.settings.userns_required
            and spec.runtime_class == RUNTIME_RUNSC
        ):
            raise BackendError.invalid(
                "user namespaces are required on this node (ORCHARD_USERNS=1) and are "
                "implemented for sandboxes runc runs (runtime classes 'runc' and "
                "'injected'), not 'runsc'",
                reason="UNSUPPORTED",
            )
        if spec.runtime_class == RUNTIME_RUNSC and spec.network.networked:
            raise BackendError.invalid(
                f"runtime class 'runsc' supports network mode 'none' only, not "
                f"{spec.network.mode!r} (gVisor's network stack reads the sandbox's interfaces "
                "once at boot, before this backend can attach one)",
                reason="UNSUPPORTED",
            )
        if spec.model_endpoint:
            self.check_model_endpoint(spec.runtime_class)
            spec = replace(spec, env={**spec.env, MODEL_ENDPOINT_ENV: MODEL_ENDPOINT_BASE})
        await self._in_thread(lambda: self._tool_mounts(spec))  # refuse before any work
        async with self._id_lock(spec.sandbox_id), self._slots.hold(slots.CREATE):
            image = await self._in_thread(lambda: self._image(spec.image))
            init_binary = await self._in_thread(self._resolve_init_binary)
            future = asyncio.get_running_loop().run_in_executor(
                self._pool, self._create_sync, spec, image, init_binary
            )
            try:
                created = await asyncio.shield(future)
                if spec.network.networked:
                    await self._network_or_undo(created, spec)
                if spec.model_endpoint:
                    await self._or_undo(spec.sandbox_id, self._open_model_endpoint(created))
                return created
            except asyncio.CancelledError:
                self._undo_after(future, spec.sandbox_id)
                raise

    async def delete(self, sandbox_id: str) -> None:
        check_sandbox_id(sandbox_id)
        async with self._id_lock(sandbox_id), self._slots.hold(slots.TEARDOWN):
            await self.model_endpoints.close(sandbox_id)
            await asyncio.shield(
                asyncio.get_running_loop().run_in_executor(
                    self._pool, self._delete_sync, sandbox_id
                )
            )
            self.network.forget_after_delete(sandbox_id)
            self._init_watch.forget(sandbox_id)

    async def failure(self, sandbox_id: str) -> BackendError | None:
        """The sandbox's init died (the reaper marks it FAILED, fault infrastructure)."""
        check_sandbox_id(sandbox_id)
        return self._init_watch.failure(sandbox_id)

    async def update_network(self, sandbox_id: str, policy: NetworkPolicySpec) -> None:
        """Give a running sandbox a new network policy (``netpolicy``); effective on return."""
        check_sandbox_id(sandbox_id)
        async with self._id_lock(sandbox_id):
            current = await self._in_thread(lambda: self._inspect_sync(sandbox_id))
            if current is None or not current.running:
                raise BackendError("SANDBOX_NOT_READY", f"sandbox {sandbox_id} is not running")
            if policy.networked and self.runsc.owns(sandbox_id):
                raise BackendError.invalid(
                    f"sandbox {sandbox_id} runs under runsc, which supports network mode "
                    f"'none' only, not {policy.mode!r}",
                    reason="UNSUPPORTED",
                )
            await self.network.apply(self._in_thread, sandbox_id, current.init_pid, policy)

    async def _network_or_undo(self, created: BackendSandbox, spec: SandboxSpec) -> None:
        await self._or_undo(
            spec.sandbox_id,
            self.network.apply(self._in_thread, spec.sandbox_id, created.init_pid, spec.network),
        )

    async def _or_undo(self, sandbox_id: str, step: Awaitable[None]) -> None:
        """Run a set-up step of a created sandbox; if it fails, remove the sandbox."""
        try:
            await step
        except BaseException as err:
            try:
                await self.model_endpoints.close(sandbox_id)
                await self._in_thread(lambda: self._delete_sync(sandbox_id))
            except (BackendError, OSError) as cleanup_err:
                err.add_note(f"cleanup after the failed set-up also failed: {cleanup_err}")
            raise

    def check_model_endpoint(self, runtime_class: str) -> None:
        """Refuse (client fault) a model endpoint for a runtime class that cannot have one."""
        if runtime_class == RUNTIME_RUNSC:
            raise BackendError.invalid(
                "model_endpoint: runtime class 'runsc' cannot have a model endpoint (gVisor's "
                "network stack runs in its Sentry, so a listener the node makes in the "
                "sandbox's namespace is not on the loopback its processes see); use 'runc' "
                "or 'injected'",
                reason="UNSUPPORTED",
            )
        self._bundle_for(runtime_class)  # an unknown or unusable class is refused as such

    async def _open_model_endpoint(self, created: BackendSandbox) -> None:
        sandbox = self.layout.sandbox(created.sandbox_id)
        tenant = await self._in_thread(lambda: tenant_key(self.layout, created.sandbox_id))
        await self.model_endpoints.open(
            created.sandbox_id, created.init_pid, sandbox.rootfs, tenant
        )
        await self._in_thread(lambda: model_endpoint.mark(sandbox.dir))

    async def _adopt_model_endpoints(self, found: builtins.list[BackendSandbox]) -> None:
        """After a restart: reopen the endpoint of every running sandbox that had one."""
        if self._endpoints_adopted:
            return
        self._endpoints_adopted = True
        for sandbox in found:
            if not sandbox.running or self.model_endpoints.is_open(sandbox.sandbox_id):
                continue
            folder = self.layout.sandbox(sandbox.sandbox_id).dir
            if not await self._in_thread(functools.partial(model_endpoint.marked, folder)):
                continue
            try:
                await self._open_model_endpoint(sandbox)
            except BackendError as err:
                log.warning("model endpoint not reopened", sandbox_id=sandbox.sandbox_id,
                            error=err.message)  # fmt: skip

    async def list(self) -> builtins.list[BackendSandbox]:
        await self.network.adopt(self._in_thread)
        found = await self._in_thread(self._list_sync)
        await self._adopt_model_endpoints(found)
        return found

    async def inspect(self, sandbox_id: str) -> BackendSandbox | None:
        check_sandbox_id(sandbox_id)
        return await self._in_thread(lambda: self._inspect_sync(sandbox_id))

    async def update_env(self, sandbox_id: str, env: dict[str, str]) -> None:
        """Merge ``env`` over a running sandbox's command environment (a warm pool claim).

        Rewrites sandbox.json atomically (a new inode), so the executor's next
        lookup sees the new env; commands already running keep theirs.
        """
        check_sandbox_id(sandbox_id)
        async with self._id_lock(sandbox_id):
            sandbox = self.layout.sandbox(sandbox_id)
            meta = await self._in_thread(lambda: _merge_env(sandbox, env))
            if injected.run_dir(sandbox).is_dir():
                # Injected: the executor inside reads its own copy (run/sandbox.json),
                # rebuilt from the host's (run/ is the sandbox's to write).
                inject = InjectedRuntime(self.settings.executor_bundle or Path(), sandbox)
                await self._in_thread(lambda: inject.update_env(meta))

    async def images(self) -> builtins.list[ImageInfo]:
        default = self.settings.default_image
        return await self._in_thread(lambda: [i.info(default) for i in self.store.list()])

    async def close(self) -> None:
        """Wait for background undo work, drop empty tenant cgroup groups, stop the thread pool.

        Sandboxes stay (and so do the groups that still hold one).
        """
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.model_endpoints.close_all()
        await self.network.close(self._in_thread)
        await self._in_thread(cgroups.remove_empty_groups)
        self._pool.shutdown(wait=True)

    # -- helpers on the event loop -----------------------------------------------

    def _sandbox_token_keys(self, sandbox_id: str) -> bytes:
        """The token keys an injected executor gets: its own sandbox's, derived from each
        of the node's keys; the node's keys never enter a sandbox."""
        ring = self.layout.keyring_file().ring()
        keys = {kid: derive_sandbox_key(key, sandbox_id) for kid, key in ring.keys.items()}
        return encode_sandbox_keys(sandbox_id, keys)

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    @contextlib.asynccontextmanager
    async def _id_lock(self, sandbox_id: str) -> AsyncIterator[None]:
        entry = self._id_locks.setdefault(sandbox_id, _IdLock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._id_locks[sandbox_id]

    def _undo_after(self, future: asyncio.Future[BackendSandbox], sandbox_id: str) -> None:
        """A create was cancelled while runc worked: delete the sandbox once it is done."""

        async def undo() -> None:
            with contextlib.suppress(BaseException):
                await future
            with contextlib.suppress(BackendError, OSError):
                await self.delete(sandbox_id)

        task = asyncio.ensure_future(undo())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- blocking work (worker threads) ------------------------------------------

    def _image(self, name: str) -> StoredImage:
        wanted = normalize_image_name(name or self.settings.default_image)
        meta = self.store.folder_of(wanted) / "image.json"
        try:
            mtime = meta.stat().st_mtime_ns
        except FileNotFoundError:
            raise BackendError(
                "IMAGE_NOT_FOUND", f"image {wanted!r} is not in the store", client_fault=True
            ) from None
        cached = self._image_cache.get(wanted)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        image = self.store.get(wanted)
        self._image_cache[wanted] = (mtime, image)
        return image

    def _tool_mounts(self, spec: SandboxSpec) -> builtins.list[dict[str, Any]]:
        """Read-only bind mounts of the tools layers ``spec`` asks for (built on this node)."""
        return [tool_layer_mount(self.settings.tools_store_dir, name) for name in spec.tool_layers]

    def _resolve_init_binary(self) -> Path:
        if self._init_binary is not None:
            return self._init_binary
        path = self.settings.init_binary
        if path is None:
            # The scheduler does not import the executor (services are
            # independent); whoever starts it passes the binary's path.
            raise BackendError.failure(
                "the local backend needs the orchard-init binary: pass --init-binary or set "
                "ORCHARD_INIT_BINARY (`python -m orchard.executor.initbin` builds it and prints "
                "its path)"
            )
        if not os.access(path, os.X_OK):
            raise BackendError.failure(f"orchard-init binary {path} is missing or not executable")
        self._init_binary = path.resolve()
        return self._init_binary

    def _create_sync(
        self, spec: SandboxSpec, image: StoredImage, init_binary: Path
    ) -> BackendSandbox:
        sandbox = self.layout.sandbox(spec.sandbox_id)
        try:
            sandbox.dir.mkdir(mode=0o700)
        except FileExistsError:
            raise BackendError(
                "ALREADY_EXISTS", f"sandbox {spec.sandbox_id} already exists on this node"
            ) from None
        try:
            return self._start(sandbox, spec, image, init_binary)
        except BaseException as err:
            try:
                self._delete_sync(spec.sandbox_id)
            except (BackendError, OSError) as cleanup_err:
                err.add_note(f"cleanup after the failed create also failed: {cleanup_err}")
            if isinstance(err, OSError):
                raise BackendError.failure(f"create {spec.sandbox_id}: {err}") from err
            raise

    def _uid_ranges(self) -> userns.UidRanges:
        """User namespaces on: the node's uid ranges, claims of a previous run read back."""
        if self.writable_layer.kind != scratch.DETACHED:
            raise BackendError.failure(
                "user namespaces (on by default) need the detached tmpfs writable layer "
                f"(Linux 6.13+, ORCHARD_SCRATCH_MOUNT=auto or detached); this node has "
                f"{self.writable_layer.kind!r}: set ORCHARD_USERNS=0 to run sandboxes without "
                "them (sandbox root is then host root)"
            )
        ranges = userns.UidRanges(
            self.layout.run / userns.CLAIMS_DIR,
            self.settings.userns_uid_base,
            self.settings.userns_ranges,
        )
        ranges.recover(self.layout.sandboxes)
        return ranges

    def _start(
        self, sandbox: SandboxLayout, spec: SandboxSpec, image: StoredImage, init_binary: Path
    ) -> BackendSandbox:
        if self.uid_ranges is None or spec.runtime_class == RUNTIME_RUNSC:
            # Off, or runsc (gVisor; refused in create when required).
            return self._start_in(sandbox, spec, image, init_binary, None)
        uid_range = self.uid_ranges.claim(sandbox.dir)
        # runc mounts the root from inside the namespace: the sandbox's root must reach
        # its folder (search only; the files there keep their own modes).
        os.chown(sandbox.dir, -1, uid_range.host_base)
        os.chmod(sandbox.dir, 0o710)
        with userns.sandbox_userns(uid_range) as held:
            return self._start_in(sandbox, spec, image, init_binary, (held, uid_range))

    def _start_in(
        self,
        sandbox: SandboxLayout,
        spec: SandboxSpec,
        image: StoredImage,
        init_binary: Path,
        ns: tuple[userns.HeldUserns, userns.UidRange] | None,
    ) -> BackendSandbox:
        sandbox.rootfs.mkdir()
        layer = self.writable_layer
        if ns is not None:
            scratch.mount_overlay_on_tmpfs(
                sandbox.rootfs, image.layer_paths, layer.size_bytes, ns[0].fd, ns[1].host_base
            )
        elif layer.kind == scratch.DETACHED:
            scratch.mount_overlay_on_tmpfs(sandbox.rootfs, image.layer_paths, layer.size_bytes)
        elif layer.kind == scratch.MOUNTED:
            scratch.mount_overlay_on_mounted_tmpfs(
                sandbox.rootfs,
                scratch.scratch_dir(sandbox.dir),
                image.layer_paths,
                layer.size_bytes,
            )
        else:
            for folder in (sandbox.upper, sandbox.work):
                folder.mkdir()
            overlay.mount_overlay(sandbox.rootfs, image.layer_paths, sandbox.upper, sandbox.work)
        bundle = self._bundle_for(spec.runtime_class)
        inject = None if bundle is None else InjectedRuntime(check_bundle(bundle), sandbox)
        gvisor = spec.runtime_class == RUNTIME_RUNSC
        config = oci_config.build_config(
            sandbox_id=spec.sandbox_id,
            rootfs=sandbox.rootfs,
            init_binary=init_binary,
            limits=oci_config.ContainerLimits(spec.cpu_millis, spec.memory_bytes, spec.pids),
            injected=inject,
            gvisor=gvisor,
            tenant=spec.tenant,
            userns=None if ns is None else (ns[0].path, ns[1].mapping),
        )
        config["mounts"].append(self.network.resolv_conf_mount(sandbox.dir))
        config["mounts"].extend(self._tool_mounts(spec))
        if ns is not None:
            userns.reroute(config, sandbox.dir, init_binary, _bundle_of(inject))
        oci_config.write_config(sandbox.dir, config)
        env = image_env_defaults(image.env)
        env.update(spec.env)
        meta = SandboxMeta(
            sandbox_id=spec.sandbox_id,
            env=env,
            memory_cgroup=str(cgroups.memory_cgroup_dir(spec.sandbox_id, spec.tenant)),
            cwd=image.cwd,
            root_uid=0 if ns is None else ns[1].host_base,
        )
        owner = None if ns is None else ns[1].host_base
        if inject is not None:
            # In a user namespace the executor is the range's root: run/ is given to it.
            inject.prepare(meta, self._sandbox_token_keys(meta.sandbox_id), owner=owner)
        if gvisor:
            # orchard-init binds its socket inside (runsc hands in no fd 3).
            init_pid = self.runsc.run_detached(
                spec.sandbox_id, sandbox.dir, sandbox.dir / PID_FILE, sandbox.dir / LOG_FILE
            )
        elif ns is not None:
            with userns.reachable_bundle(sandbox.dir, init_binary, _bundle_of(inject)):
                init_pid = self._run_runc(spec.sandbox_id, sandbox, inject, owner)
        else:
            init_pid = self._run_runc(spec.sandbox_id, sandbox, inject, None)
        if inject is not None:
            inject.wait_ready(
                init_pid, sandbox.dir / LOG_FILE, self.settings.executor_start_timeout
            )
        # Started at the top CPU weight (oci_config.STARTING_CPU_SHARES); commands run at the default.
        cgroups.set_cpu_weight(
            cgroups.cpu_cgroup_dirs(spec.sandbox_id, spec.tenant), starting=False
        )
        replace(meta, init_pid=init_pid).write(sandbox.meta_file)
        address = "" if inject is None else injected.executor_address(sandbox)
        return BackendSandbox(
            spec.sandbox_id, running=True, init_pid=init_pid, executor_address=address
        )

    def _run_runc(
        self,
        sandbox_id: str,
        sandbox: SandboxLayout,
        inject: InjectedRuntime | None,
        owner: int | None,
    ) -> int:
        """``runc run`` with the init socket, bound here on the host, as the container's fd 3.
        ``owner``: the host uid of the sandbox's root in its user namespace; an injected
        executor (that root) connects to the socket by its path in run/."""
        socket_path = sandbox.init_socket if inject is None else inject.init_socket
        with init_socket.listen_at(socket_path) as listener:
            if inject is not None and owner is not None:
                os.chown(socket_path, owner, owner)
            return self.runc.run_detached(
                sandbox_id,
                sandbox.dir,
                listener.fileno(),
                sandbox.dir / PID_FILE,
                sandbox.dir / LOG_FILE,
            )

    def check_runtime_class(self, runtime_class: str) -> None:
        """Refuse (BackendError, client fault) a runtime class this backend cannot run."""
        self._bundle_for(runtime_class)

    def _bundle_for(self, runtime_class: str) -> Path | None:
        """The executor bundle when this sandbox runs injected, None when the node executor serves it.

        "" follows the backend's setting (a bundle configured = injected), "runc"
        is always the node executor, "injected" needs a bundle, and so does
        "runsc" (gVisor; always injected, ``runsc.py`` says why) with runsc installed.
        """
        bundle = self.settings.executor_bundle
        if runtime_class == RUNTIME_RUNSC:
            self.runsc.check_available()
            if bundle is None:
                raise BackendError.invalid(
                    "runtime class 'runsc' runs the executor inside the gVisor sandbox and needs "
                    "an executor bundle (scheduler --executor-bundle or ORCHARD_EXECUTOR_BUNDLE)",
                    reason="UNSUPPORTED",
                )
            return bundle
        if runtime_class == RUNTIME_INJECTED:
            if bundle is None:
                raise BackendError.invalid(
                    "runtime class 'injected' needs an executor bundle (scheduler "
                    "--executor-bundle or ORCHARD_EXECUTOR_BUNDLE)",
                    reason="UNSUPPORTED",
                )
            return bundle
        if runtime_class == RUNTIME_RUNC:
            return None
        if runtime_class:
            raise BackendError.invalid(
                f"runtime class {runtime_class[:64]!r} is not available on the local backend "
                f"(known: {', '.join(LOCAL_RUNTIME_CLASSES)})",
                reason="UNSUPPORTED",
            )
        return bundle

    def _delete_sync(self, sandbox_id: str) -> None:
        sandbox = self.layout.sandbox(sandbox_id)
        # First, before anything goes: calls failing from here on are "not found".
        with contextlib.suppress(OSError):
            sandbox.deleting_marker.touch()
        if self.runsc.owns(sandbox_id):
            self._delete_runsc(sandbox_id)
        runc_state = self.runc.state_dir(sandbox_id)
        uid_range = None if self.uid_ranges is None else self.uid_ranges.of_sandbox(sandbox.dir)
        found = cgroups.sandbox_cgroup_dirs(sandbox_id)
        if runc_state.exists():
            state = self.runc.state(sandbox_id)
            stopped = state is None or not state.running
            if not stopped:
                assert state is not None
                # The dying processes must run to exit (and drop their kernel locks) soon.
                # Only a speed-up: a weight that cannot be written must not stop the teardown.
                with contextlib.suppress(OSError):
                    cgroups.set_cpu_weight(found, starting=True)
                stopped = kill_and_wait(state.init_pid, state.init_start_time)
            if not stopped:
                try:
                    self.runc.delete(sandbox_id, force=True)
                except BackendError:
                    # runc cannot read its own state (a create killed half-way):
                    # kill what runs in the sandbox's cgroups; the state goes below.
                    _kill_cgroup_processes(sandbox_id)
            # Its init is dead, so the kernel kills the rest of its pid namespace:
            # what ``runc delete`` would still do (rmdir the cgroups, drop the state
            # dir) is done below without starting runc (~5 ms of CPU per sandbox).
        self.network.detach_sync(sandbox_id)
        if uid_range is not None:
            userns.drop_reachable(sandbox.dir)  # left by a create killed while runc ran
        if sandbox.dir.exists():
            overlay.unmount_overlay(sandbox.rootfs)
            scratch.unmount_scratch(sandbox.dir)  # after the overlay that sits on it
            # An injected sandbox's capped run/ (mounted before anything is written there,
            # so a create that failed or was killed after that step left it too).
            run_folder.unmount(injected.run_dir(sandbox))
        leftover = cgroups.remove_sandbox_cgroups(sandbox_id, found=found)
        if leftover:
            _kill_cgroup_processes(sandbox_id)
            leftover = cgroups.remove_sandbox_cgroups(sandbox_id)
        if not leftover:
            # Last: while the state dir exists, list() still finds a half-deleted sandbox.
            shutil.rmtree(runc_state, ignore_errors=True)
            if self.uid_ranges is not None and uid_range is not None:
                # Nothing runs as its uids any more: the range may go to the next sandbox.
                self.uid_ranges.release_index(uid_range.index, sandbox_id)
        shutil.rmtree(sandbox.dir, ignore_errors=True)
        if sandbox.dir.exists():
            raise BackendError.failure(f"delete {sandbox_id}: could not remove {sandbox.dir}")
        if leftover:
            raise BackendError.failure(
                f"delete {sandbox_id}: cgroups still busy: {', '.join(map(str, leftover))}"
            )

    def _delete_runsc(self, sandbox_id: str) -> None:
        """Kill the Sentry and the gofer (a gofer can outlive ``runsc delete --force``),
        then let runsc remove its state and cgroups; if runsc cannot, kill what is in
        the sandbox's cgroups and drop its files."""
        for pid, start in self.runsc.host_processes(sandbox_id):
            kill_and_wait(pid, start)
        try:
            self.runsc.delete(sandbox_id)
        except BackendError:
            _kill_cgroup_processes(sandbox_id)
            self.runsc.forget(sandbox_id)

    def _container_state(self, sandbox_id: str) -> ContainerState | None:
        if self.runsc.owns(sandbox_id):
            return self.runsc.state(sandbox_id)
        return self.runc.state(sandbox_id)

    def _known_ids(self) -> set[str]:
        ids = set(self.runc.container_ids())
        ids.update(self.runsc.container_ids())
        with contextlib.suppress(FileNotFoundError):
            ids.update(entry.name for entry in os.scandir(self.layout.sandboxes))
        return {sandbox_id for sandbox_id in ids if valid_sandbox_id(sandbox_id)}

    def _inspect_sync(self, sandbox_id: str) -> BackendSandbox | None:
        state = self._container_state(sandbox_id)
        sandbox = self.layout.sandbox(sandbox_id)
        if state is None:
            if not sandbox.dir.exists():
                return None
            return BackendSandbox(sandbox_id, running=False, init_pid=0)
        run = injected.run_dir(sandbox)
        address = injected.executor_address(sandbox) if run.is_dir() else ""
        return BackendSandbox(
            sandbox_id, running=state.running, init_pid=state.init_pid, executor_address=address
        )

    def _list_sync(self) -> builtins.list[BackendSandbox]:
        found: builtins.list[BackendSandbox] = []
        for sandbox_id in sorted(self._known_ids()):
            sandbox = self._inspect_sync(sandbox_id)
            if sandbox is not None:
                found.append(sandbox)
        return found


def _log_userns(settings: LocalSettings) -> None:
    if settings.userns_required:
        log.info("user namespaces: required for every sandbox (ORCHARD_USERNS=1)")
    else:
        log.info(
            "user namespaces: on for runtime classes 'runc' and 'injected'; sandboxes of "
            "runtime class 'runsc' run without one (ORCHARD_USERNS=1 refuses them, "
            "ORCHARD_USERNS=0 turns namespaces off)"
        )


def _bundle_of(inject: InjectedRuntime | None) -> Path | None:
    return None if inject is None else inject.bundle


def _log_writable_layer(layer: scratch.WritableLayer) -> None:
    """Once per start: where sandboxes write, loudly when it is the old-kernel fallback."""
    fields = {"layer": layer.kind, "size_bytes": layer.size_bytes, "kernel": layer.kernel}
    if layer.kind == scratch.MOUNTED:
        log.warning("sandbox writable layer: fallback", why=layer.why, **fields)
    elif layer.kind == scratch.ON_DISK:
        log.warning("sandbox writable layer: no per-sandbox disk cap", **fields)
    else:
        log.info("sandbox writable layer", **fields)


def _merge_env(sandbox: SandboxLayout, env: dict[str, str]) -> SandboxMeta:
    try:
        meta = SandboxMeta.from_json(sandbox.meta_file.read_text())
    except FileNotFoundError:
        raise BackendError.failure(f"sandbox {sandbox.sandbox_id} has no sandbox.json") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BackendError.failure(
            f"sandbox {sandbox.sandbox_id}: unreadable sandbox.json: {err}"
        ) from err
    if meta.init_pid and not _alive(meta.init_pid):
        # A member whose container died while it waited must not be handed out.
        raise BackendError.failure(f"sandbox {sandbox.sandbox_id}: its init is not running")
    merged = replace(meta, env={**meta.env, **env})
    merged.write(sandbox.meta_file)
    return merged


def _kill_cgroup_processes(sandbox_id: str) -> None:
    """SIGKILL every process in the sandbox's cgroups and wait briefly for them to go."""
    pids: set[int] = set()
    for folder in cgroups.sandbox_cgroup_dirs(sandbox_id):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while pids and time.monotonic() < deadline:
        pids = {pid for pid in pids if _alive(pid)}
        if pids:
            time.sleep(0.005)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno != errno.ESRCH
    return True
