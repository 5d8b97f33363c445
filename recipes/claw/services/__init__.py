"""The Claw recipe's mock services: mail, calendar, contacts, files, todo, web search and the
tau2 retail / airline domains, run inside the task's sandbox, reached by the agent as tools
(plain HTTP/JSON and MCP) and by the grader through their audit log and final state.

``ClawServices.start(sandbox, fixtures)`` (:mod:`.client`) is the driver's handle; the
fixture format is :mod:`.fixtures`; the code that runs in the sandbox is :mod:`.box`
(stdlib only, plus the ``mcp`` package for its MCP server); how it gets there is
:mod:`.runtime`. See ``docs/recipes/claw-services.md``.
"""

from .client import (
    AuditEntry,
    ClawServices,
    Health,
    RuntimeNotBuilt,
    ServiceOptions,
    ServicesAdminError,
    ServicesError,
    ServicesLost,
    ServicesStartError,
    ServicesTampered,
)
from .fixtures import (
    Busy,
    CalendarFixture,
    Contact,
    ContactsFixture,
    Event,
    File,
    FilesFixture,
    Fixtures,
    MailFixture,
    Message,
    Page,
    Tau2Fixture,
    Todo,
    TodoFixture,
    WebFixture,
)

__all__ = [
    "AuditEntry",
    "Busy",
    "CalendarFixture",
    "ClawServices",
    "Contact",
    "ContactsFixture",
    "Event",
    "File",
    "FilesFixture",
    "Fixtures",
    "Health",
    "MailFixture",
    "Message",
    "Page",
    "RuntimeNotBuilt",
    "ServiceOptions",
    "ServicesAdminError",
    "ServicesError",
    "ServicesLost",
    "ServicesStartError",
    "ServicesTampered",
    "Tau2Fixture",
    "Todo",
    "TodoFixture",
    "WebFixture",
]
