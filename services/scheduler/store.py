"""SandboxStore: the scheduler's state in one SQLite file (WAL).

Why SQLite: one node, one writer, and a restart must lose nothing. WAL with
``synchronous=NORMAL`` makes a write a few tens of microseconds (no fsync per
commit; durable across a process crash, which is what recovery needs), so the
calls run inline on the event loop instead of paying a thread hop per write.

The schema carries a version (``PRAGMA user_version``); ``_MIGRATIONS`` lists
the steps from each version to the next.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path


class State(IntEnum):
    """Mirrors ``orchard.v1.SandboxState`` (same numbers)."""

    PENDING = 1
    READY = 2
    DELETING = 3
    DELETED = 4
    FAILED = 5
    CLAIMED = 6


LIVE_STATES = (State.PENDING, State.READY, State.CLAIMED, State.DELETING, State.FAILED)
# States in which a sandbox runs and its owner may use it.
USABLE_STATES = (State.READY, State.CLAIMED)
# The tenant of a warm pool member until a claim gives it one. Real tenants
# match ``[A-Za-z0-9][A-Za-z0-9._-]*``, so the empty name can never collide.
POOL_TENANT = ""


@dataclass(frozen=True)
class SandboxRecord:
    id: str
    tenant: str
    image: str
    cpu_millis: int
    memory_bytes: int
    pids: int
    network_mode: int
    ttl_seconds: int
    created_at: float
    expires_at: float
    state: State = State.PENDING
    state_reason: str = ""
    # Whose fault a FAILED state is: "client" (e.g. unknown image) or "infrastructure".
    fault: str = ""
    # For FAILED: the ErrorReason name the backend gave (e.g. IMAGE_NOT_FOUND).
    error_reason: str = ""
    request_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    # The template it was made from ("" for a plain create); with tenant
    # POOL_TENANT and state READY it is an unclaimed warm pool member.
    template: str = ""
    # When a client claimed it (0: never claimed).
    claimed_at: float = 0.0
    # Where clients reach its own executor ("" = the node executor serves it):
    # injected mode's unix socket, a Kubernetes pod's IP:port.
    executor_address: str = ""
    # The runtime class it was created with ("" = the backend's default).
    runtime_class: str = ""
    # Created with a model endpoint inside (CreateSandboxRequest.model_endpoint).
    model_endpoint: bool = False
    # The tools layers mounted into it (``tools.layers``), in the order asked.
    tool_layers: tuple[str, ...] = ()

    @property
    def in_pool(self) -> bool:
        """An unclaimed warm pool member (no client can see it)."""
        return bool(self.template) and self.tenant == POOL_TENANT

    def with_state(
        self, state: State, reason: str = "", fault: str = "", error_reason: str = ""
    ) -> SandboxRecord:
        return replace(
            self, state=state, state_reason=reason, fault=fault, error_reason=error_reason
        )


_MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1
    """
    CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        request_id TEXT NOT NULL DEFAULT '',
        image TEXT NOT NULL,
        cpu_millis INTEGER NOT NULL,
        memory_bytes INTEGER NOT NULL,
        pids INTEGER NOT NULL,
        network_mode INTEGER NOT NULL,
        ttl_seconds INTEGER NOT NULL,
        labels TEXT NOT NULL,
        env TEXT NOT NULL,
        state INTEGER NOT NULL,
        state_reason TEXT NOT NULL DEFAULT '',
        fault TEXT NOT NULL DEFAULT '',
        error_reason TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    );
    CREATE UNIQUE INDEX sandboxes_request ON sandboxes (tenant, request_id) WHERE request_id != '';
    CREATE INDEX sandboxes_tenant_state ON sandboxes (tenant, state);
    CREATE INDEX sandboxes_expiry ON sandboxes (state, expires_at);
    """,
    # 1 -> 2: templates and warm pools
    """
    ALTER TABLE sandboxes ADD COLUMN template TEXT NOT NULL DEFAULT '';
    ALTER TABLE sandboxes ADD COLUMN claimed_at REAL NOT NULL DEFAULT 0;
    CREATE INDEX sandboxes_pool ON sandboxes (template, state, tenant, created_at);
    """,
    # 2 -> 3: per-sandbox executors (injected runtime, Kubernetes pods)
    """
    ALTER TABLE sandboxes ADD COLUMN executor_address TEXT NOT NULL DEFAULT '';
    ALTER TABLE sandboxes ADD COLUMN runtime_class TEXT NOT NULL DEFAULT '';
    """,
    # 3 -> 4: the model endpoint inside a sandbox
    """
    ALTER TABLE sandboxes ADD COLUMN model_endpoint INTEGER NOT NULL DEFAULT 0;
    """,
    # 4 -> 5: tools layers (a JSON list of names)
    """
    ALTER TABLE sandboxes ADD COLUMN tool_layers TEXT NOT NULL DEFAULT '[]';
    """,
)
SCHEMA_VERSION = len(_MIGRATIONS)

_COLUMNS = (
    "id, tenant, request_id, image, cpu_millis, memory_bytes, pids, network_mode, ttl_seconds,"
    " labels, env, state, state_reason, fault, error_reason, created_at, expires_at,"
    " template, claimed_at, executor_address, runtime_class, model_endpoint, tool_layers"
)


class DuplicateRequestError(Exception):
    """A sandbox with this (tenant, request_id) already exists."""


class SandboxStore:
    """Reads and writes sandbox records; one instance per scheduler process."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"state.db has schema version {version}; this scheduler knows up to {SCHEMA_VERSION}"
            )
        for step in range(version, SCHEMA_VERSION):
            self._db.executescript(
                f"BEGIN; {_MIGRATIONS[step]} PRAGMA user_version = {step + 1}; COMMIT;"
            )

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def _row(row: tuple[object, ...]) -> SandboxRecord:
        (
            sid,
            tenant,
            request_id,
            image,
            cpu,
            mem,
            pids,
            net,
            ttl,
            labels,
            env,
            state,
            reason,
            fault,
            error_reason,
            created,
            expires,
            template,
            claimed_at,
            executor_address,
            runtime_class,
            model_endpoint,
            tool_layers,
        ) = row
        return SandboxRecord(
            id=str(sid),
            tenant=str(tenant),
            request_id=str(request_id),
            image=str(image),
            cpu_millis=int(cpu),  # type: ignore[call-overload]
            memory_bytes=int(mem),  # type: ignore[call-overload]
            pids=int(pids),  # type: ignore[call-overload]
            network_mode=int(net),  # type: ignore[call-overload]
            ttl_seconds=int(ttl),  # type: ignore[call-overload]
            labels=json.loads(str(labels)),
            env=json.loads(str(env)),
            state=State(int(state)),  # type: ignore[call-overload]
            state_reason=str(reason),
            fault=str(fault),
            error_reason=str(error_reason),
            created_at=float(created),  # type: ignore[arg-type]
            expires_at=float(expires),  # type: ignore[arg-type]
            template=str(template),
            claimed_at=float(claimed_at),  # type: ignore[arg-type]
            executor_address=str(executor_address),
            runtime_class=str(runtime_class),
            model_endpoint=bool(model_endpoint),
            tool_layers=tuple(str(n) for n in json.loads(str(tool_layers))),
        )

    def insert(self, rec: SandboxRecord) -> None:
        try:
            self._db.execute(
                f"INSERT INTO sandboxes ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rec.id, rec.tenant, rec.request_id, rec.image, rec.cpu_millis, rec.memory_bytes,
                    rec.pids, rec.network_mode, rec.ttl_seconds, json.dumps(rec.labels), json.dumps(rec.env),
                    int(rec.state), rec.state_reason, rec.fault, rec.error_reason, rec.created_at, rec.expires_at,
                    rec.template, rec.claimed_at, rec.executor_address, rec.runtime_class,
                    int(rec.model_endpoint),
                    json.dumps(list(rec.tool_layers)),
                ),
            )  # fmt: skip
        except sqlite3.IntegrityError as exc:
            raise DuplicateRequestError(rec.request_id) from exc

    def set_state(
        self,
        sandbox_id: str,
        state: State,
        reason: str = "",
        fault: str = "",
        error_reason: str = "",
    ) -> None:
        self._db.execute(
            "UPDATE sandboxes SET state = ?, state_reason = ?, fault = ?, error_reason = ? WHERE id = ?",
            (int(state), reason, fault, error_reason, sandbox_id),
        )

    def set_executor_address(self, sandbox_id: str, address: str) -> None:
        """Record where the sandbox's own executor serves ("" = the node executor)."""
        self._db.execute(
            "UPDATE sandboxes SET executor_address = ? WHERE id = ?", (address, sandbox_id)
        )

    def release_request(self, sandbox_id: str) -> None:
        """Forget a record's request id (a claim that failed hands it to the next try)."""
        self._db.execute("UPDATE sandboxes SET request_id = '' WHERE id = ?", (sandbox_id,))

    def get(self, sandbox_id: str) -> SandboxRecord | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM sandboxes WHERE id = ?", (sandbox_id,)
        ).fetchone()
        return None if row is None else self._row(row)

    def get_by_request(self, tenant: str, request_id: str) -> SandboxRecord | None:
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM sandboxes WHERE tenant = ? AND request_id = ?",
            (tenant, request_id),
        ).fetchone()
        return None if row is None else self._row(row)

    def find(
        self,
        tenant: str | None = None,
        states: Iterable[State] = LIVE_STATES,
        labels: dict[str, str] | None = None,
        template: str | None = None,
    ) -> list[SandboxRecord]:
        """Records in ``states`` (of ``tenant``/``template``, if given) carrying all ``labels``, oldest first."""
        wanted = [int(s) for s in states]
        sql = f"SELECT {_COLUMNS} FROM sandboxes WHERE state IN ({','.join('?' * len(wanted))})"
        args: list[object] = list(wanted)
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        if template is not None:
            sql += " AND template = ?"
            args.append(template)
        for key, value in (labels or {}).items():
            sql += " AND json_extract(labels, ?) = ?"
            args.extend((f'$."{key}"', value))
        sql += " ORDER BY created_at, id"
        return [self._row(r) for r in self._db.execute(sql, args).fetchall()]

    def usage(self, tenant: str, states: Iterable[State]) -> tuple[int, int, int]:
        """(sandboxes, cpu millis, memory bytes) of ``tenant``'s records in ``states``.

        One aggregate over the (tenant, state) index: a quota check per create must not
        build a record for every live sandbox (that made N creates cost O(N^2)).
        """
        wanted = [int(s) for s in states]
        row = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(cpu_millis), 0), COALESCE(SUM(memory_bytes), 0)"
            f" FROM sandboxes WHERE tenant = ? AND state IN ({','.join('?' * len(wanted))})",
            (tenant, *wanted),
        ).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def expired(self, now: float) -> list[SandboxRecord]:
        """Sandboxes past their expiry that still hold (or may hold) a container."""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM sandboxes WHERE state IN (?, ?, ?, ?) AND expires_at <= ?",
            (int(State.PENDING), int(State.READY), int(State.CLAIMED), int(State.FAILED), now),
        ).fetchall()
        return [self._row(r) for r in rows]

    def purge_deleted(self, before: float) -> int:
        """Forget DELETED records created before ``before``; returns how many."""
        cur = self._db.execute(
            "DELETE FROM sandboxes WHERE state = ? AND expires_at < ?", (int(State.DELETED), before)
        )
        return cur.rowcount

    # ---- warm pools and leases ------------------------------------------------

    def claim(
        self,
        template: str,
        tenant: str,
        *,
        request_id: str,
        labels: dict[str, str],
        env: dict[str, str],
        ttl_seconds: int,
        now: float,
    ) -> SandboxRecord | None:
        """Adopt the oldest ready member of ``template``'s pool for ``tenant``, or None.

        One UPDATE statement picks and takes the member: SQLite runs a statement
        under the database's write lock, and the WHERE clause re-checks that the
        row is still READY and pool-owned (a compare-and-set), so two claims (from
        coroutines, threads or processes on the same file) never get the same
        sandbox. The claim's env is merged over the member's (``json_patch``);
        labels, ttl and the owner are replaced.
        """
        try:
            row = self._db.execute(
                f"""
                UPDATE sandboxes SET state = ?, tenant = ?, request_id = ?, labels = ?,
                    env = json_patch(env, ?), ttl_seconds = ?, expires_at = ?, claimed_at = ?
                WHERE id = (
                    SELECT id FROM sandboxes WHERE template = ? AND state = ? AND tenant = ?
                    ORDER BY created_at, id LIMIT 1
                ) AND state = ? AND tenant = ?
                RETURNING {_COLUMNS}
                """,
                (
                    int(State.CLAIMED), tenant, request_id, json.dumps(labels), json.dumps(env),
                    ttl_seconds, now + ttl_seconds, now,
                    template, int(State.READY), POOL_TENANT, int(State.READY), POOL_TENANT,
                ),
            ).fetchone()  # fmt: skip
        except sqlite3.IntegrityError as exc:
            raise DuplicateRequestError(request_id) from exc
        return None if row is None else self._row(row)

    def extend_lease(self, sandbox_id: str, expires_at: float) -> SandboxRecord | None:
        """Move a usable sandbox's expiry forward to ``expires_at`` (never back)."""
        row = self._db.execute(
            f"UPDATE sandboxes SET expires_at = MAX(expires_at, ?) "
            f"WHERE id = ? AND state IN (?, ?) RETURNING {_COLUMNS}",
            (expires_at, sandbox_id, *map(int, USABLE_STATES)),
        ).fetchone()
        return None if row is None else self._row(row)

    def retire_pool_member(self, sandbox_id: str, why: str) -> SandboxRecord | None:
        """Mark an unclaimed READY member DELETING, unless a claim took it first (compare-and-set)."""
        row = self._db.execute(
            f"UPDATE sandboxes SET state = ?, state_reason = ? "
            f"WHERE id = ? AND state = ? AND tenant = ? RETURNING {_COLUMNS}",
            (int(State.DELETING), why, sandbox_id, int(State.READY), POOL_TENANT),
        ).fetchone()
        return None if row is None else self._row(row)

    def pool_counts(self) -> dict[str, dict[str, int]]:
        """Per template: how many sandboxes are "ready" and "pending" in the pool, and "claimed"."""
        counts: dict[str, dict[str, int]] = {}
        rows = self._db.execute(
            "SELECT template, state, tenant = ?, COUNT(*) FROM sandboxes"
            " WHERE template != '' AND state IN (?, ?, ?) GROUP BY 1, 2, 3",
            (POOL_TENANT, int(State.PENDING), int(State.READY), int(State.CLAIMED)),
        ).fetchall()
        for template, state, pooled, n in rows:
            entry = counts.setdefault(str(template), {"ready": 0, "pending": 0, "claimed": 0})
            if not pooled:
                entry["claimed"] += int(n)
            elif int(state) == State.READY:
                entry["ready"] += int(n)
            elif int(state) == State.PENDING:
                entry["pending"] += int(n)
        return counts
