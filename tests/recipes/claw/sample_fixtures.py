"""One fixture set with every service, shared by the services' tests."""

from __future__ import annotations

from pathlib import Path

from orchard.recipes.claw.services import (
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
    Todo,
    TodoFixture,
    WebFixture,
)


def sample_fixtures(files_root: Path | str = "/workspace/files") -> Fixtures:
    return Fixtures(
        now="2026-03-02T09:00:00+00:00",
        mail=MailFixture(
            messages=[
                Message(id="m1", sender="bob@example.org", to=["me@example.com"],
                        subject="Lunch on Friday?", body="Are you free for lunch on Friday at noon?",
                        date="2026-03-01T10:00:00Z"),
                Message(id="m2", sender="alice@example.org", to=["me@example.com", "carol@example.org"],
                        cc=["dave@example.org"], subject="Q1 report", body="The Q1 report is attached.",
                        date="2026-03-01T12:00:00Z", read=True),
                Message(id="m3", folder="archive", sender="news@example.net", to=["me@example.com"],
                        subject="Weekly digest", body="Old news.", date="2026-02-20T08:00:00Z"),
            ]
        ),
        calendar=CalendarFixture(
            events=[
                Event(id="e1", title="Standup", start="2026-03-02T09:30:00Z",
                      end="2026-03-02T10:00:00Z", attendees=["bob@example.org"]),
                Event(id="e2", title="Dentist", start="2026-03-03T15:00:00Z",
                      end="2026-03-03T16:00:00Z"),
            ],
            others_busy=[Busy(email="bob@example.org", start="2026-03-02T13:00:00Z",
                              end="2026-03-02T15:00:00Z")],
        ),
        contacts=ContactsFixture(
            contacts=[
                Contact(id="c1", name="Bob Builder", emails=["bob@example.org"], company="Acme"),
                Contact(id="c2", name="Alice Smith", emails=["alice@example.org"], phones=["+1 555 0100"]),
            ]
        ),
        files=FilesFixture(
            root=str(files_root),
            files=[File(path="notes/todo.txt", text="buy milk\n"),
                   File(path="data.bin", base64="AAEC/w==")],
        ),
        todo=TodoFixture(items=[Todo(id="t1", title="File taxes", due="2026-04-15"),
                                Todo(id="t2", title="Call mom", done=True)]),
        web=WebFixture(
            pages=[
                Page(url="https://recipes.example/carbonara", title="Carbonara",
                     text="Spaghetti carbonara needs eggs, pecorino and guanciale."),
                Page(url="https://weather.example/paris", title="Paris weather",
                     text="Paris: sunny, 14 degrees on Monday."),
            ]
        ),
    )  # fmt: skip
