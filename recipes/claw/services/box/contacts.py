"""The contacts service: an address book; search, get, create, update."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from .core import Call, Tool, ToolError, check_email, next_id, schema, string, strings

MAX_CONTACTS = 10_000
FIELDS = ("name", "emails", "phones", "company", "title", "notes")


class Contacts:
    service = "contacts"

    def __init__(self, fixture: dict[str, Any], now: dt.datetime) -> None:
        self.contacts: dict[str, dict[str, Any]] = {}
        for c in fixture.get("contacts") or []:
            self.contacts[c["id"]] = {
                "id": c["id"],
                **{k: copy.deepcopy(c.get(k, "")) for k in FIELDS},
            }
            for key in ("emails", "phones"):
                self.contacts[c["id"]][key] = list(c.get(key) or [])

    def _get(self, contact_id: str) -> dict[str, Any]:
        contact = self.contacts.get(contact_id)
        if contact is None:
            raise ToolError("not_found", f"no contact with id {contact_id!r}")
        return contact

    def _checked(self, fields: dict[str, Any]) -> dict[str, Any]:
        if "emails" in fields:
            fields["emails"] = [check_email(x, "emails") for x in fields["emails"]]
        if "name" in fields and not fields["name"].strip():
            raise ToolError("invalid_arguments", "name: must not be empty")
        return fields

    def search(self, call: Call) -> dict[str, Any]:
        terms = call.arguments["query"].lower().split()
        if not terms:
            raise ToolError("invalid_arguments", "query: give at least one word")
        found = []
        for c in self.contacts.values():
            hay = " ".join(
                [
                    c["name"],
                    " ".join(c["emails"]),
                    " ".join(c["phones"]),
                    c["company"],
                    c["title"],
                    c["notes"],
                ]
            ).lower()
            if all(t in hay for t in terms):
                found.append(dict(c))
        found.sort(key=lambda c: (c["name"], c["id"]))
        return {"total": len(found), "contacts": found[: call.arguments.get("limit", 20)]}

    def get(self, call: Call) -> dict[str, Any]:
        return dict(self._get(call.arguments["contact_id"]))

    def create(self, call: Call) -> dict[str, Any]:
        if len(self.contacts) >= MAX_CONTACTS:
            raise ToolError("too_large", f"the address book holds {MAX_CONTACTS} contacts: no more")
        fields = self._checked(dict(call.arguments))
        contact = {"id": next_id("contact", self.contacts), "name": fields["name"],
                   "emails": fields.get("emails", []), "phones": fields.get("phones", []),
                   "company": fields.get("company", ""), "title": fields.get("title", ""),
                   "notes": fields.get("notes", "")}  # fmt: skip
        self.contacts[contact["id"]] = contact
        return dict(contact)

    def update(self, call: Call) -> dict[str, Any]:
        contact = self._get(call.arguments["contact_id"])
        fields = self._checked({k: v for k, v in call.arguments.items() if k != "contact_id"})
        if not fields:
            raise ToolError("invalid_arguments", "give at least one field to change")
        call.destructive = any(
            contact[k] and contact[k] != v
            for k, v in fields.items()
            if k in ("emails", "phones", "name")
        )
        contact.update(fields)
        return dict(contact)

    def state(self) -> dict[str, Any]:
        return {"contacts": copy.deepcopy(sorted(self.contacts.values(), key=lambda c: c["id"]))}

    def tools(self) -> list[Tool]:
        fields = {
            "name": string("Full name.", 300),
            "emails": strings("E-mail addresses.", 20),
            "phones": strings("Phone numbers.", 20, 64),
            "company": string("Company.", 300),
            "title": string("Job title.", 300),
            "notes": string("Notes.", 20_000),
        }
        cid = string("The contact's id (from contacts_search).", 128)
        return [
            Tool("contacts_search", self.service,
                 "Find contacts whose name, e-mail, phone, company, title or notes contain every "
                 "word of the query (case-insensitive).",
                 schema({"query": string("Words to look for.", 500, minLength=1),
                         "limit": {"type": "integer", "minimum": 1, "maximum": 100,
                                   "description": "At most this many (default 20)."}},
                        ("query",)),
                 self.search),
            Tool("contacts_get", self.service, "One contact in full.",
                 schema({"contact_id": cid}, ("contact_id",)), self.get),
            Tool("contacts_create", self.service, "Add a contact.",
                 schema(fields, ("name",)), self.create, mutating=True),
            Tool("contacts_update", self.service,
                 "Change fields of a contact (a list given replaces the old one).",
                 schema({"contact_id": cid, **fields}, ("contact_id",)), self.update, mutating=True),
        ]  # fmt: skip
