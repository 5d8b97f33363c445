"""Locust: the original's 1000-sandbox scenario, one pass per user, through the Orchard SDK.

Each user, once: create a sandbox (default image, network policy ``none``; or
claim one from the warm pool ``$ORCHARD_LOCUST_TEMPLATE``), run the original's
four commands, delete it, and stop. When every user has stopped the run quits
by itself (``--run-time`` is only the bound). Every SDK call is reported to
Locust by ``LocustInterceptor`` (create, ``exec python3``, ``exec ls``,
``exec cat``, ``exec login-shell cat``, delete); a non-zero exit code or output
that is not what the command prints counts as a failure.

The stack runs in its own processes (``loadtest/run_locust.py`` starts one in
a temporary home); this file only needs ``ORCHARD_ENDPOINT`` and
``ORCHARD_API_KEY``. ``ORCHARD_LOCUST_PHASES`` (a folder, optional): each
process writes there, at the end, when each of its users started, had created,
had executed and had deleted, so the driver can tell which phase is slow.

    ORCHARD_ENDPOINT=... ORCHARD_API_KEY=... \\
      locust -f loadtest/locustfile.py --headless -u 1000 -r 1000 --run-time 300s \\
        --csv build/loadtest/cold --html build/loadtest/cold.html
"""

from __future__ import annotations

# Locust has monkey-patched the standard library by the time this file runs;
# grpc must be told before any channel exists, or its calls block the hub.
import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
from locust import User, constant, events, task  # noqa: E402
from locust.env import Environment  # noqa: E402
from locust.exception import StopUser  # noqa: E402
from locust.runners import WorkerRunner  # noqa: E402
from locust.stats import CSV_STATS_INTERVAL_SEC  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtest.locust_checks import COMMANDS, create_check  # noqa: E402
from loadtest.locust_interceptor import LocustInterceptor, operation  # noqa: E402
from orchard import Orchard, OrchardError, Sandbox  # noqa: E402

EXEC_TIMEOUT_SECONDS = 120.0
CREATE_TIMEOUT_SECONDS = 300.0


OPERATIONS = ("create", *(name for name, _, _ in COMMANDS), "delete")

# The one client of this Locust process, made when Locust starts (its interceptor times
# every call); users share it, as a trainer's workers share one client.
_client: Orchard | None = None

# When this process's users started and finished each phase (epoch seconds).
_phases: list[dict[str, float | bool]] = []
_spawning_done = False


class SandboxUser(User):
    """One pass of create -> 4 commands -> delete, then the user stops."""

    wait_time = constant(0)

    @task
    def scenario(self) -> None:
        template = os.environ.get("ORCHARD_LOCUST_TEMPLATE", "")
        mark: dict[str, float | bool] = {"start": time.time(), "ok": False}
        _phases.append(mark)
        sandbox: Sandbox | None = None
        assert _client is not None, "the init listener makes the client"
        try:
            with operation("create", create_check):
                if template:
                    sandbox = _client.sandboxes.create(
                        template=template, timeout=CREATE_TIMEOUT_SECONDS
                    )
                else:
                    sandbox = _client.sandboxes.create(
                        network="none", timeout=CREATE_TIMEOUT_SECONDS
                    )
            mark["created"] = time.time()
            passed = True
            for name, argv, check in COMMANDS:
                with operation(name, check):
                    result = sandbox.exec(argv, timeout=EXEC_TIMEOUT_SECONDS)
                passed = passed and check(result) is None
            mark["executed"] = time.time()
            with operation("delete"):
                sandbox.delete()
            mark["deleted"] = time.time()
            mark["ok"] = passed
        except OrchardError:
            # Already reported to Locust by the interceptor; try not to leave the sandbox behind.
            if sandbox is not None and not mark.get("deleted"):
                with operation("delete"):
                    try:
                        sandbox.delete()
                        mark["deleted"] = time.time()
                    except OrchardError:
                        pass
        finally:
            mark["end"] = time.time()
        raise StopUser()


@events.init.add_listener
def _make_client(environment: Environment, **_: Any) -> None:
    global _client
    _client = Orchard(interceptors=[LocustInterceptor(environment)])


@events.spawning_complete.add_listener
def _spawned(user_count: int, **_: Any) -> None:
    global _spawning_done
    _spawning_done = True


@events.test_start.add_listener
def _watch_for_the_end(environment: Environment, **_: Any) -> None:
    """Quit once every user has run its one pass (the master or a lone runner decides)."""
    runner = environment.runner
    if runner is None or isinstance(runner, WorkerRunner):
        return

    def watch() -> None:
        while not (_spawning_done and runner.user_count == 0):
            gevent.sleep(0.05)
        # Locust writes --csv once a second from its own greenlet and not again at exit:
        # let it write the finished stats before quitting (wall time is measured from the
        # users' own marks, so this wait is not part of it).
        gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.5)
        runner.quit()

    gevent.spawn(watch)


@events.quitting.add_listener
def _write_phases(environment: Environment, **_: Any) -> None:
    folder = os.environ.get("ORCHARD_LOCUST_PHASES")
    if folder and _phases:
        path = Path(folder) / f"phases-{os.getpid()}.json"
        path.write_text(json.dumps(_phases))
