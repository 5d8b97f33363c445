"""The mail service: a mailbox with folders; list, search, read, send, reply, delete, move.

Sending goes nowhere: a sent message lands in ``sent`` (dated with the services' clock)
and is what a grader checks. ``mail_read`` marks a message read (not counted as mutating:
reading is what the user asked for). ``mail_delete`` moves a message to ``trash``, or
removes it for good when it is already there (both destructive).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from .core import (
    Call,
    Tool,
    ToolError,
    boolean,
    check_email,
    integer,
    iso,
    next_id,
    schema,
    string,
    strings,
)

SNIPPET = 160
MAX_MESSAGES = 10_000
MAX_BODY = 100_000


class Mail:
    service = "mail"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.now = now
        self.address = str(fixture.get("address") or "me@example.com")
        self.folders = list(fixture.get("folders") or ["inbox", "sent", "trash"])
        self.messages: dict[str, dict[str, Any]] = {}
        for m in fixture.get("messages") or []:
            message = {
                "id": m["id"],
                "folder": m.get("folder", "inbox"),
                "sender": m["sender"],
                "to": list(m.get("to") or []),
                "cc": list(m.get("cc") or []),
                "subject": m.get("subject", ""),
                "body": m.get("body", ""),
                "date": m["date"],
                "read": bool(m.get("read", False)),
                "labels": list(m.get("labels") or []),
                "in_reply_to": m.get("in_reply_to"),
            }
            self.messages[message["id"]] = message

    # ---- helpers ----------------------------------------------------------------

    def _get(self, message_id: str) -> dict[str, Any]:
        message = self.messages.get(message_id)
        if message is None:
            raise ToolError("not_found", f"no message with id {message_id!r}")
        return message

    def _summary(self, m: dict[str, Any]) -> dict[str, Any]:
        body = " ".join(m["body"].split())
        return {
            "id": m["id"],
            "folder": m["folder"],
            "from": m["sender"],
            "to": m["to"],
            "subject": m["subject"],
            "date": m["date"],
            "read": m["read"],
            "snippet": body[:SNIPPET],
        }

    def _full(self, m: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": m["id"],
            "folder": m["folder"],
            "from": m["sender"],
            "to": m["to"],
            "cc": m["cc"],
            "subject": m["subject"],
            "date": m["date"],
            "body": m["body"],
            "labels": m["labels"],
            "in_reply_to": m["in_reply_to"],
        }

    def _folder(self, folder: str) -> str:
        if folder not in self.folders:
            raise ToolError("not_found", f"no folder {folder!r}; folders: {self.folders}")
        return folder

    def _sorted(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(messages, key=lambda m: (m["date"], m["id"]), reverse=True)

    def _store(self, **fields: Any) -> dict[str, Any]:
        if len(self.messages) >= MAX_MESSAGES:
            raise ToolError("too_large", f"the mailbox holds {MAX_MESSAGES} messages: no more")
        message_id = next_id("msg", self.messages)
        message = {
            "id": message_id,
            "folder": "sent",
            "sender": self.address,
            "cc": [],
            "date": iso(self.now),
            "read": True,
            "labels": [],
            "in_reply_to": None,
            **fields,
        }
        self.messages[message_id] = message
        return message

    # ---- operations --------------------------------------------------------------

    def listing(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        folder = self._folder(a.get("folder", "inbox"))
        found = [
            m
            for m in self.messages.values()
            if m["folder"] == folder and not (a.get("unread_only") and m["read"])
        ]
        found = self._sorted(found)
        offset, limit = a.get("offset", 0), a.get("limit", 20)
        return {
            "folder": folder,
            "total": len(found),
            "messages": [self._summary(m) for m in found[offset : offset + limit]],
        }

    def search(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        terms = a["query"].lower().split()
        if not terms:
            raise ToolError("invalid_arguments", "query: give at least one word")
        folder = a.get("folder")
        if folder is not None:
            self._folder(folder)
        found = []
        for m in self.messages.values():
            if folder is not None and m["folder"] != folder:
                continue
            haystack = " ".join(
                [m["sender"], " ".join(m["to"]), " ".join(m["cc"]), m["subject"], m["body"]]
            ).lower()
            if all(t in haystack for t in terms):
                found.append(m)
        found = self._sorted(found)
        return {
            "total": len(found),
            "messages": [self._summary(m) for m in found[: a.get("limit", 20)]],
        }

    def read(self, call: Call) -> dict[str, Any]:
        message = self._get(call.arguments["message_id"])
        message["read"] = True
        return self._full(message)

    def send(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        to = [check_email(x, "to") for x in a["to"]]
        cc = [check_email(x, "cc") for x in a.get("cc", [])]
        if not to:
            raise ToolError("invalid_arguments", "to: give at least one recipient")
        message = self._store(to=to, cc=cc, subject=a["subject"], body=a["body"])
        return {"id": message["id"], "folder": "sent", "date": message["date"]}

    def reply(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        original = self._get(a["message_id"])
        to = [original["sender"]] if original["sender"] != self.address else list(original["to"])
        cc: list[str] = []
        if a.get("reply_all"):
            others = [x for x in original["to"] + original["cc"] if x != self.address]
            cc = [x for x in others if x not in to]
        subject = original["subject"]
        if not subject.lower().startswith("re:"):
            subject = f"Re: {subject}"
        message = self._store(
            to=to, cc=cc, subject=subject, body=a["body"], in_reply_to=original["id"]
        )
        return {"id": message["id"], "to": to, "cc": cc, "subject": subject, "folder": "sent"}

    def delete(self, call: Call) -> dict[str, Any]:
        message = self._get(call.arguments["message_id"])
        if message["folder"] == "trash":
            del self.messages[message["id"]]
            return {"id": message["id"], "deleted": "permanently"}
        message["folder"] = "trash"
        return {"id": message["id"], "deleted": "moved to trash"}

    def move(self, call: Call) -> dict[str, Any]:
        a = call.arguments
        message = self._get(a["message_id"])
        folder = self._folder(a["folder"])
        call.destructive = folder == "trash"
        previous, message["folder"] = message["folder"], folder
        return {"id": message["id"], "from_folder": previous, "folder": folder}

    # ---- the service -------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "folders": list(self.folders),
            "messages": copy.deepcopy(self._sorted(list(self.messages.values()))),
        }

    def tools(self) -> list[Tool]:
        mid = string("The message's id (from mail_list or mail_search).", 128)
        return [
            Tool("mail_list", self.service, "List the messages of a folder, newest first.",
                 schema({"folder": string("Folder name (default inbox).", 100),
                         "unread_only": boolean("Only unread messages."),
                         "limit": integer("At most this many (default 20).", 1, 100),
                         "offset": integer("Skip this many (paging).", 0, MAX_MESSAGES)}),
                 self.listing),
            Tool("mail_search", self.service,
                 "Search messages whose sender, recipients, subject or body contain every word "
                 "of the query (case-insensitive), newest first.",
                 schema({"query": string("Words to look for.", 500, minLength=1),
                         "folder": string("Only this folder.", 100),
                         "limit": integer("At most this many (default 20).", 1, 100)},
                        ("query",)),
                 self.search),
            Tool("mail_read", self.service, "Read one message in full (marks it read).",
                 schema({"message_id": mid}, ("message_id",)), self.read),
            Tool("mail_send", self.service, f"Send a new message from {self.address}.",
                 schema({"to": strings("Recipients' e-mail addresses."),
                         "cc": strings("Copy recipients."),
                         "subject": string("Subject line.", 1000),
                         "body": string("Message text.", MAX_BODY)},
                        ("to", "subject", "body")),
                 self.send, mutating=True),
            Tool("mail_reply", self.service,
                 "Reply to a message (to its sender; reply_all adds the other recipients).",
                 schema({"message_id": mid, "body": string("Reply text.", MAX_BODY),
                         "reply_all": boolean("Also to every other recipient.")},
                        ("message_id", "body")),
                 self.reply, mutating=True),
            Tool("mail_delete", self.service,
                 "Delete a message: to trash, or for good if it is in trash already.",
                 schema({"message_id": mid}, ("message_id",)),
                 self.delete, mutating=True, destructive=True),
            Tool("mail_move", self.service, "Move a message to another folder.",
                 schema({"message_id": mid, "folder": string("Target folder.", 100)},
                        ("message_id", "folder")),
                 self.move, mutating=True),
        ]  # fmt: skip
