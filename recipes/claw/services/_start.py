"""Starting the services in a sandbox and talking to them (the body of :class:`ClawServices`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard import AsyncSandbox

    from .client import ClawServices, Health, ServiceOptions
    from .fixtures import Fixtures


async def start_services(
    cls: type[ClawServices], sandbox: AsyncSandbox, fixtures: Fixtures, options: ServiceOptions
) -> ClawServices:
    raise NotImplementedError("ClawServices.start: being implemented (wt-claw-svc)")


async def call_tool(services: ClawServices, name: str, arguments: str | Mapping[str, Any]) -> str:
    raise NotImplementedError


async def health(services: ClawServices) -> Health:
    raise NotImplementedError


async def reset(services: ClawServices, fixtures: Fixtures) -> None:
    raise NotImplementedError


async def admin(services: ClawServices, op: str, body: Mapping[str, Any]) -> dict[str, Any]:
    raise NotImplementedError
