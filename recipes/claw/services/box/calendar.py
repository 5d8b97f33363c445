"""The calendar service: the user's events (list, create, update, delete) and free/busy.

``calendar_freebusy`` answers for the user (their events) and for the people in the
fixture's ``others_busy``, and proposes the slots free for everyone asked about, inside the
working hours (UTC), on the days of the window. Times in and out are ISO 8601 (UTC out).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from .core import (
    Call,
    Tool,
    ToolError,
    check_email,
    iso,
    next_id,
    parse_time,
    schema,
    string,
    strings,
)

MAX_EVENTS = 10_000
MAX_WINDOW = dt.timedelta(days=62)
TIME = "ISO 8601 time, e.g. 2026-03-02T14:00:00+00:00"


class Calendar:
    service = "calendar"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.now = now
        self.owner = str(fixture.get("owner") or "me@example.com")
        self.hours = tuple(fixture.get("working_hours") or (9, 17))
        self.events: dict[str, dict[str, Any]] = {}
        for e in fixture.get("events") or []:
            self.events[e["id"]] = {
                "id": e["id"],
                "title": e["title"],
                "start": iso(parse_time(e["start"], "start")),
                "end": iso(parse_time(e["end"], "end")),
                "attendees": list(e.get("attendees") or []),
                "location": e.get("location", ""),
                "description": e.get("description", ""),
            }
        self.others = [
            (b["email"], parse_time(b["start"], "start"), parse_time(b["end"], "end"))
            for b in fixture.get("others_busy") or []
        ]

    def _get(self, event_id: str) -> dict[str, Any]:
        event = self.events.get(event_id)
        if event is None:
            raise ToolError("not_found", f"no event with id {event_id!r}")
        return event

    def _window(self, a: dict[str, Any], required: bool) -> tuple[dt.datetime, dt.datetime] | None:
        if "start" not in a and "end" not in a and not required:
            return None
        if "start" not in a or "end" not in a:
            raise ToolError("invalid_arguments", "give both start and end, or neither")
        start, end = parse_time(a["start"], "start"), parse_time(a["end"], "end")
        if end <= start:
            raise ToolError("invalid_arguments", "end must be after start")
        if end - start > MAX_WINDOW:
            raise ToolError("invalid_arguments", f"the window is at most {MAX_WINDOW.days} days")
        return start, end

    @staticmethod
    def _span(event: dict[str, Any]) -> tuple[dt.datetime, dt.datetime]:
        return dt.datetime.fromisoformat(event["start"]), dt.datetime.fromisoformat(event["end"])

    def _sorted(self) -> list[dict[str, Any]]:
        return sorted(self.events.values(), key=lambda e: (e["start"], e["id"]))

    # ---- operations --------------------------------------------------------------

    def listing(self, call: Call) -> dict[str, Any]:
        window = self._window(call.arguments, required=False)
        found = []
        for event in self._sorted():
            start, end = self._span(event)
            if window is None or (start < window[1] and end > window[0]):
                found.append(dict(event))
        return {"total": len(found), "events": found[:200]}

    def create(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        if len(self.events) >= MAX_EVENTS:
            raise ToolError("too_large", f"the calendar holds {MAX_EVENTS} events: no more")
        start, end = parse_time(a["start"], "start"), parse_time(a["end"], "end")
        if end <= start:
            raise ToolError("invalid_arguments", "end must be after start")
        event = {
            "id": next_id("evt", self.events),
            "title": a["title"],
            "start": iso(start),
            "end": iso(end),
            "attendees": [check_email(x, "attendees") for x in a.get("attendees", [])],
            "location": a.get("location", ""),
            "description": a.get("description", ""),
        }
        self.events[event["id"]] = event
        return dict(event)

    def update(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        event = self._get(a["event_id"])
        changed = {k: v for k, v in a.items() if k != "event_id"}
        if not changed:
            raise ToolError("invalid_arguments", "give at least one field to change")
        new = dict(event)
        for key in ("start", "end"):
            if key in changed:
                new[key] = iso(parse_time(changed.pop(key), key))
        if "attendees" in changed:
            changed["attendees"] = [check_email(x, "attendees") for x in changed["attendees"]]
        new.update(changed)
        start, end = self._span(new)
        if end <= start:
            raise ToolError("invalid_arguments", "end must be after start")
        call.destructive = any(event[k] != new[k] for k in ("start", "end", "attendees"))
        self.events[event["id"]] = new
        return dict(new)

    def delete(self, call: Call) -> dict[str, Any]:
        event = self._get(call.arguments["event_id"])
        del self.events[event["id"]]
        return {"id": event["id"], "deleted": True, "title": event["title"]}

    def freebusy(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        window = self._window(a, required=True)
        assert window is not None
        start, end = window
        emails = [check_email(x, "emails") for x in a.get("emails") or [self.owner]]
        busy: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {e: [] for e in emails}
        for event in self.events.values():
            s, e = self._span(event)
            if s < end and e > start:
                for who in emails:
                    if who == self.owner or who in event["attendees"]:
                        busy[who].append((s, e))
        for who, s, e in self.others:
            if who in busy and s < end and e > start:
                busy[who].append((s, e))
        blocks = sorted(b for spans in busy.values() for b in spans)
        free = []
        day = start.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        while day < end:
            open_, close = day.replace(hour=self.hours[0]), day + dt.timedelta(hours=self.hours[1])
            cursor = max(open_, start)
            for s, e in blocks:
                if e <= cursor or s >= min(close, end):
                    continue
                if s > cursor:
                    free.append((cursor, s))
                cursor = max(cursor, e)
            if cursor < min(close, end):
                free.append((cursor, min(close, end)))
            day += dt.timedelta(days=1)
        return {
            "busy": {
                who: [[iso(s), iso(e)] for s, e in sorted(spans)] for who, spans in busy.items()
            },
            "free": [[iso(s), iso(e)] for s, e in free if e > s],
            "working_hours_utc": list(self.hours),
        }

    # ---- the service -------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"owner": self.owner, "events": copy.deepcopy(self._sorted())}

    def tools(self) -> list[Tool]:
        eid = string("The event's id (from calendar_list).", 128)
        fields = {
            "title": string("Title.", 500),
            "start": string(f"Start, {TIME}.", 64),
            "end": string(f"End, {TIME}.", 64),
            "attendees": strings("Attendees' e-mail addresses.", 200),
            "location": string("Location.", 500),
            "description": string("Description.", 20_000),
        }
        return [
            Tool("calendar_list", self.service,
                 "List events, by start; with start and end only those overlapping that window.",
                 schema({"start": string(f"Window start, {TIME}.", 64),
                         "end": string(f"Window end, {TIME}.", 64)}),
                 self.listing),
            Tool("calendar_create", self.service, "Create an event.",
                 schema(fields, ("title", "start", "end")), self.create, mutating=True),
            Tool("calendar_update", self.service, "Change fields of an event.",
                 schema({"event_id": eid, **fields}, ("event_id",)), self.update, mutating=True),
            Tool("calendar_delete", self.service, "Delete an event.",
                 schema({"event_id": eid}, ("event_id",)),
                 self.delete, mutating=True, destructive=True),
            Tool("calendar_freebusy", self.service,
                 f"Busy times of the user ({self.owner}) or of the given people in a window, "
                 "and the slots free for all of them within working hours.",
                 schema({"start": string(f"Window start, {TIME}.", 64),
                         "end": string(f"Window end, {TIME}.", 64),
                         "emails": strings("Whose free/busy (default: the user).", 50)},
                        ("start", "end")),
                 self.freebusy),
        ]  # fmt: skip
