"""All the services of one sandbox: built from the fixtures, reset, called, audited."""

from __future__ import annotations

import datetime as dt
import os
import threading
from typing import Any

from .calendar import Calendar
from .contacts import Contacts
from .core import MAX_AUDIT, Registry
from .files import Files
from .mail import Mail
from .tau2 import Tau2
from .todo import Todos
from .web import Web

SERVICES: dict[str, Any] = {
    "mail": Mail,
    "calendar": Calendar,
    "contacts": Contacts,
    "files": Files,
    "todo": Todos,
    "web": Web,
    "tau2": Tau2,
}


class Stack:
    """Empty until the driver's first reset (the fixtures come over the admin channel)."""

    def __init__(self, audit_capacity: int = MAX_AUDIT) -> None:
        self.audit_capacity = audit_capacity
        self.registry = Registry(audit_capacity)
        self.services: dict[str, Any] = {}
        self.lock = threading.Lock()

    def reset(self, fixtures: Any) -> dict[str, Any]:
        if not isinstance(fixtures, dict):
            raise ValueError("fixtures must be an object")
        unknown = sorted(set(fixtures) - set(SERVICES) - {"now"})
        if unknown:
            raise ValueError(f"unknown services in the fixtures: {unknown}")
        now = dt.datetime.fromisoformat(str(fixtures.get("now") or "2026-03-02T09:00:00+00:00"))
        services = {
            name: cls(fixtures[name], now)
            for name, cls in SERVICES.items()
            if fixtures.get(name) is not None
        }
        if not services:
            raise ValueError("the fixtures offer no service")
        registry = Registry(self.audit_capacity)
        for service in services.values():
            registry.add(service.tools())
        # no call runs on the old services while they go
        with self.lock, self.registry.lock:
            self.services, self.registry = services, registry
        return {"services": list(services), "tools": registry.specs()}

    def call(
        self, name: Any, arguments: Any, channel: str, parse_error: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            registry = self.registry
        return registry.call(name, arguments, channel, parse_error)

    def specs(self) -> list[dict[str, Any]]:
        with self.lock:
            return self.registry.specs()

    def health(self) -> dict[str, Any]:
        with self.lock:
            return {
                "ok": True,
                "services": list(self.services),
                "pid": os.getpid(),
                "calls": len(self.registry.audit.entries),
            }

    def audit(self) -> dict[str, Any]:
        with self.lock:
            registry = self.registry
        with registry.lock:
            return {
                "entries": [dict(e) for e in registry.audit.entries],
                "refused": registry.audit.refused,
                "capacity": registry.audit.capacity,
            }

    def state(self) -> dict[str, Any]:
        with self.lock:
            services, registry = self.services, self.registry
        with registry.lock:
            return {name: service.state() for name, service in services.items()}
