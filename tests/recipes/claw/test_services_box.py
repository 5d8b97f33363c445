"""The Claw services' in-sandbox server as a real process on the host (no sandbox): every
service's operations, reset, the audit log, the signed admin channel, hostile inputs (paths
that try to leave the files root, links planted in it, bad JSON, oversized and chunked
bodies, wrong types, unknown fields, a runaway ``calculate``), and the tau2 wrapper.

The live tests (a real sandbox) are ``test_services_live.py``; MCP through the real ``mcp``
client is ``test_services_mcp.py``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from orchard.recipes.claw import tau2
from orchard.recipes.claw.services import Fixtures, Tau2Fixture

from .box_process import BoxProcess, box_process
from .sample_fixtures import sample_fixtures

pytestmark = pytest.mark.timeout(120)


def test_tools_are_listed_as_openai_function_tools(box: BoxProcess) -> None:
    tools = box.request("GET", "/v1/tools").json["tools"]
    names = [t["function"]["name"] for t in tools]
    assert names == [
        "mail_list", "mail_search", "mail_read", "mail_send", "mail_reply", "mail_delete",
        "mail_move", "calendar_list", "calendar_create", "calendar_update", "calendar_delete",
        "calendar_freebusy", "contacts_search", "contacts_get", "contacts_create",
        "contacts_update", "files_list", "files_read", "files_write", "files_delete",
        "todo_list", "todo_add", "todo_complete", "todo_delete", "web_search", "web_fetch",
    ]  # fmt: skip
    for tool in tools:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])


def test_mail(box: BoxProcess) -> None:
    inbox = box.ok("mail_list")
    assert [m["id"] for m in inbox["messages"]] == ["m2", "m1"]  # newest first
    assert box.ok("mail_list", unread_only=True)["total"] == 1
    assert [m["id"] for m in box.ok("mail_search", query="q1 REPORT")["messages"]] == ["m2"]
    assert box.ok("mail_search", query="digest", folder="archive")["total"] == 1
    assert box.ok("mail_read", message_id="m1")["body"].startswith("Are you free")
    assert box.ok("mail_list", unread_only=True)["total"] == 0
    sent = box.ok("mail_send", to=["zoe@example.org"], subject="Hi", body="Hello")
    reply = box.ok("mail_reply", message_id="m2", body="Thanks", reply_all=True)
    assert reply["to"] == ["alice@example.org"]
    assert reply["cc"] == ["carol@example.org", "dave@example.org"]
    assert reply["subject"] == "Re: Q1 report"
    assert box.ok("mail_move", message_id="m1", folder="archive")["folder"] == "archive"
    assert box.ok("mail_delete", message_id="m3")["deleted"] == "moved to trash"
    assert box.ok("mail_delete", message_id="m3")["deleted"] == "permanently"
    box.error("mail_read", {"message_id": "m3"}, "not_found")
    box.error("mail_move", {"message_id": "m1", "folder": "nowhere"}, "not_found")
    box.error(
        "mail_send", {"to": ["not an address"], "subject": "x", "body": "y"}, "invalid_arguments"
    )
    box.error("mail_send", {"to": [], "subject": "x", "body": "y"}, "invalid_arguments")
    messages = {m["id"]: m for m in box.state()["mail"]["messages"]}
    assert messages[sent["id"]]["folder"] == "sent"
    assert messages[sent["id"]]["date"] == "2026-03-02T09:00:00Z"  # the fixtures' clock
    assert messages[reply["id"]]["in_reply_to"] == "m2"
    assert "m3" not in messages and messages["m1"]["folder"] == "archive"


def test_calendar(box: BoxProcess) -> None:
    day = {"start": "2026-03-02T00:00:00Z", "end": "2026-03-03T00:00:00Z"}
    assert [e["id"] for e in box.ok("calendar_list", **day)["events"]] == ["e1"]
    assert box.ok("calendar_list")["total"] == 2
    free = box.ok("calendar_freebusy", **day, emails=["me@example.com", "bob@example.org"])
    assert free["busy"]["bob@example.org"] == [
        ["2026-03-02T09:30:00Z", "2026-03-02T10:00:00Z"],
        ["2026-03-02T13:00:00Z", "2026-03-02T15:00:00Z"],
    ]
    assert free["free"] == [
        ["2026-03-02T09:00:00Z", "2026-03-02T09:30:00Z"],
        ["2026-03-02T10:00:00Z", "2026-03-02T13:00:00Z"],
        ["2026-03-02T15:00:00Z", "2026-03-02T17:00:00Z"],
    ]
    event = box.ok("calendar_create", title="Lunch with Bob", start="2026-03-06T12:00:00+01:00",
                   end="2026-03-06T13:00:00+01:00", attendees=["bob@example.org"])  # fmt: skip
    assert event["start"] == "2026-03-06T11:00:00Z"  # kept in UTC
    moved = box.ok("calendar_update", event_id=event["id"], start="2026-03-06T12:00:00Z",
                   end="2026-03-06T13:00:00Z")  # fmt: skip
    assert moved["title"] == "Lunch with Bob" and moved["start"] == "2026-03-06T12:00:00Z"
    box.ok("calendar_delete", event_id="e2")
    box.error("calendar_create", {"title": "x", "start": "2026-03-06T13:00:00Z",
                                  "end": "2026-03-06T12:00:00Z"}, "invalid_arguments")  # fmt: skip
    box.error(
        "calendar_create", {"title": "x", "start": "tomorrow", "end": "later"}, "invalid_arguments"
    )
    box.error("calendar_update", {"event_id": "e1"}, "invalid_arguments")
    box.error("calendar_freebusy", {"start": "2026-01-01T00:00:00Z", "end": "2026-12-01T00:00:00Z"},
              "invalid_arguments")  # fmt: skip
    assert [e["id"] for e in box.state()["calendar"]["events"]] == ["e1", event["id"]]


def test_contacts_and_todo(box: BoxProcess) -> None:
    assert [c["id"] for c in box.ok("contacts_search", query="acme")["contacts"]] == ["c1"]
    assert box.ok("contacts_get", contact_id="c2")["phones"] == ["+1 555 0100"]
    new = box.ok("contacts_create", name="Carol Jones", emails=["carol@example.org"])
    box.ok("contacts_update", contact_id=new["id"], company="Initech")
    box.error("contacts_get", {"contact_id": "nobody"}, "not_found")
    box.error("contacts_create", {"name": "X", "emails": ["nope"]}, "invalid_arguments")
    assert [t["id"] for t in box.ok("todo_list")["items"]] == ["t1"]
    added = box.ok("todo_add", title="Book flights", due="2026-03-10", priority="high")
    box.ok("todo_complete", todo_id="t1")
    box.error("todo_complete", {"todo_id": "t1"}, "conflict")
    box.ok("todo_delete", todo_id="t2")
    box.error("todo_add", {"title": "x", "due": "next week"}, "invalid_arguments")
    box.error("todo_add", {"title": "x", "priority": "urgent"}, "invalid_arguments")
    state = box.state()
    assert {c["id"]: c["company"] for c in state["contacts"]["contacts"]}[new["id"]] == "Initech"
    assert {t["id"]: t["done"] for t in state["todo"]["items"]} == {"t1": True, added["id"]: False}


def test_files(box: BoxProcess, tmp_path: Path) -> None:
    root = tmp_path / "files"
    listing = box.ok("files_list", recursive=True)["entries"]
    assert [(e["path"], e["type"]) for e in listing] == [
        ("data.bin", "file"), ("notes", "folder"), ("notes/todo.txt", "file"),
    ]  # fmt: skip
    assert box.ok("files_read", path="notes/todo.txt")["text"] == "buy milk\n"
    assert box.ok("files_read", path="data.bin")["base64"] == "AAEC/w=="
    assert box.ok("files_write", path="notes/todo.txt", content="eggs\n", append=True)["replaced"]
    assert (root / "notes/todo.txt").read_text() == "buy milk\neggs\n"
    assert box.ok("files_write", path="out/report.md", content="# Q1")["replaced"] is False
    box.ok("files_delete", path="data.bin")
    box.error("files_delete", {"path": "notes"}, "conflict")  # not empty
    box.error("files_read", {"path": "notes"}, "conflict")
    box.error("files_read", {"path": "missing.txt"}, "not_found")
    files = box.state()["files"]["files"]
    assert files["out/report.md"]["text"] == "# Q1" and "data.bin" not in files
    audit = {e["arguments"].get("path"): e for e in box.audit() if e["operation"] == "files_write"}
    assert audit["notes/todo.txt"]["destructive"] is False  # an append
    assert audit["out/report.md"]["destructive"] is False  # a new file
    box.ok("files_write", path="out/report.md", content="# Q2")
    assert box.audit()[-1]["destructive"] is True  # replaced what was there


@pytest.mark.parametrize(
    "path",
    ["../outside.txt", "notes/../../outside.txt", "./notes/todo.txt", "notes//todo.txt",
     "notes/./todo.txt", "..", "a/\u0000/b"],
)  # fmt: skip
def test_files_refuse_paths_that_leave_the_root(box: BoxProcess, tmp_path: Path, path: str) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    for op, args in (("files_read", {}), ("files_write", {"content": "x"}), ("files_delete", {})):
        answer = box.call(op, {"path": path, **args})
        assert not answer.json["ok"], (op, path, answer.body)
        assert answer.json["error"]["code"] in ("forbidden", "invalid_arguments")
    assert (tmp_path / "outside.txt").read_text() == "secret"


def test_files_do_not_follow_links_planted_in_the_root(box: BoxProcess, tmp_path: Path) -> None:
    root = tmp_path / "files"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside, root / "escape")  # a folder link, as an agent's shell could plant
    os.symlink(outside / "secret.txt", root / "secret-link.txt")
    box.error("files_read", {"path": "escape/secret.txt"}, "forbidden")
    box.error("files_read", {"path": "secret-link.txt"}, "forbidden")
    box.error("files_write", {"path": "escape/new.txt", "content": "x"}, "forbidden")
    box.error("files_write", {"path": "secret-link.txt", "content": "x"}, "conflict")
    box.error("files_list", {"path": "escape"}, "forbidden")
    assert {e["path"]: e["type"] for e in box.ok("files_list")["entries"]}["escape"] == "symlink"
    assert (outside / "secret.txt").read_text() == "secret" and not (outside / "new.txt").exists()
    state = box.state()["files"]["files"]
    assert state["escape"] == {"type": "symlink", "target": str(outside)}
    assert "escape/secret.txt" not in state
    # a reset removes the links, never what they point at
    box.reset(sample_fixtures(root).wire())
    assert not (root / "escape").exists() and (outside / "secret.txt").read_text() == "secret"
    # the root itself replaced by a link: refused, not followed
    os.rename(root, tmp_path / "files-moved")
    os.symlink(outside, root)
    box.error("files_read", {"path": "secret.txt"}, "not_found")


def test_web(box: BoxProcess) -> None:
    results = box.ok("web_search", query="carbonara eggs")["results"]
    assert results[0]["url"] == "https://recipes.example/carbonara"
    assert "pecorino" in results[0]["snippet"]
    assert box.ok("web_search", query="nothing matches this")["results"] == []
    assert "14 degrees" in box.ok("web_fetch", url="https://weather.example/paris")["text"]
    box.error("web_fetch", {"url": "https://elsewhere.example/"}, "not_found")
    assert box.state()["web"]["fetched"] == ["https://weather.example/paris"]


def test_every_call_is_audited_in_order(box: BoxProcess) -> None:
    box.ok("mail_list")
    box.call("no_such_tool", {"x": 1})
    box.call("mail_read", {"message_id": 5})
    box.call("mail_read", raw=b"{not json")
    box.ok("mail_delete", message_id="m1")
    box.ok("todo_add", title="x")
    entries = box.audit()
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5, 6]
    assert [(e["service"], e["operation"], e["status"]) for e in entries] == [
        ("mail", "mail_list", "ok"), ("?", "no_such_tool", "error"),
        ("mail", "mail_read", "error"), ("mail", "mail_read", "error"),
        ("mail", "mail_delete", "ok"), ("todo", "todo_add", "ok"),
    ]  # fmt: skip
    assert entries[1]["error"].startswith("unknown_tool:") and entries[1]["arguments"] == {"x": 1}
    assert "expected string, got integer" in entries[2]["error"]
    assert entries[3]["error"].startswith("invalid_arguments: the body is not JSON")
    assert [(e["mutating"], e["destructive"]) for e in entries] == [
        (False, False),
        (False, False),
        (False, False),
        (False, False),
        (True, True),
        (True, False),
    ]
    assert all(e["channel"] == "http" for e in entries)
    assert entries[0]["time"] <= entries[-1]["time"]
    assert entries[4]["result"] == {"id": "m1", "deleted": "moved to trash"}


def test_reset_restores_every_service_and_empties_the_audit(
    box: BoxProcess, tmp_path: Path
) -> None:
    before = box.state()
    box.ok("mail_delete", message_id="m1")
    box.ok("files_write", path="extra.txt", content="x")
    (tmp_path / "files" / "by-shell.txt").write_text("written by the agent's shell")
    box.ok("calendar_delete", event_id="e1")
    box.ok("todo_add", title="y")
    assert box.state() != before
    box.reset(sample_fixtures(tmp_path / "files").wire())
    assert box.state() == before
    assert box.audit() == []
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == ["data.bin", "notes"]
    # other fixtures: other services, other tools
    box.reset(Fixtures(todo=sample_fixtures().todo).wire())
    assert [t["function"]["name"] for t in box.request("GET", "/v1/tools").json["tools"]] == [
        "todo_list",
        "todo_add",
        "todo_complete",
        "todo_delete",
    ]
    box.error("mail_list", {}, "unknown_tool")


def test_hostile_arguments_and_bodies(box: BoxProcess) -> None:
    box.error("mail_list", {"folder": "inbox", "limit": 10**9}, "invalid_arguments")
    box.error("mail_list", {"limit": True}, "invalid_arguments")  # a bool is no integer
    message = box.error("mail_list", {"folder": "inbox", "sudo": True}, "invalid_arguments")
    assert "unknown field 'sudo'" in message
    box.error("mail_search", {"query": "x" * 501}, "invalid_arguments")
    box.error("mail_list", [1, 2], "invalid_arguments")
    deep = b"[" * 100_000 + b"]" * 100_000
    assert box.call("mail_list", raw=deep).json["error"]["code"] == "invalid_arguments"
    big = box.call("files_write", raw=b'{"path": "a", "content": "' + b"x" * (3 << 20) + b'"}')
    assert big.status == 413 and big.json["error"]["code"] == "too_large"
    box.error(
        "files_write", {"path": "big.txt", "content": "x" * ((1 << 20) + 1)}, "invalid_arguments"
    )
    # a chunked body is refused, not read without bound
    with socket.create_connection(("127.0.0.1", box.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/tools/mail_list HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\n{}   \r\n0\r\n\r\n")  # fmt: skip
        assert sock.recv(200).startswith(b"HTTP/1.1 411")
    assert box.request("GET", "/etc/passwd").status == 404
    assert box.request("POST", "/v1/elsewhere", b"{}").status == 404
    # the arguments as a JSON string (some models send them so) are read as the object
    assert box.call("mail_list", raw=json.dumps(json.dumps({"folder": "archive"})).encode()).json[
        "ok"
    ]


def test_a_refused_body_is_read_before_the_close_so_the_client_sees_the_answer(
    box: BoxProcess,
) -> None:
    """Closing with a refused body unread makes the kernel reset the connection: the client,
    still sending, saw "connection reset" instead of the 413 (a CI failure under load)."""
    body = b"x" * (3 << 20)  # more than the socket buffers hold: the server must read it
    head = f"POST /v1/tools/files_write HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", box.port), timeout=20) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_the_admin_channel_is_the_drivers_alone(box: BoxProcess) -> None:
    body = b'{"fixtures": {"todo": {"items": []}}}'
    assert box.request("POST", "/admin/reset", body).status == 401
    forged = {"X-Claw-Nonce": "n1", "X-Claw-Auth": "0" * 64}
    assert box.request("POST", "/admin/audit", b"{}", forged).status == 401
    assert box.admin("audit", {}, nonce="once").status == 200
    assert box.admin("audit", {}, nonce="once").status == 401  # a nonce is good once
    # the answer is signed for the request's nonce (checked in BoxProcess.admin); a bad
    # fixture is the driver's error, told in the signed answer
    bad = box.admin("reset", {"fixtures": {"mail": None, "nothing": {}}})
    assert bad.status == 400 and "unknown services" in bad.json["error"]["message"]
    assert box.request("GET", "/v1/tools").json["tools"]  # the old services stay


def test_a_full_audit_log_refuses_calls_instead_of_dropping_them(tmp_path: Path) -> None:
    with box_process("--max-audit", "3") as box:
        box.reset(Fixtures(todo=sample_fixtures().todo).wire())
        for _ in range(3):
            box.ok("todo_list")
        answer = box.call("todo_add", {"title": "never runs"})
        assert answer.status == 429 and answer.json["error"]["code"] == "audit_full"
        audit = box.admin("audit", {}).json
        assert len(audit["entries"]) == 3 and audit["refused"] == 1
        assert all(t["title"] != "never runs" for t in box.state()["todo"]["items"])


def test_tau2_domains_run_as_a_service_without_their_control_tools() -> None:
    with box_process() as box:
        box.reset(Fixtures(tau2=Tau2Fixture(domain="retail")).wire())
        tools = {t["function"]["name"]: t for t in box.request("GET", "/v1/tools").json["tools"]}
        assert "reset_state" not in tools and "get_call_log" not in tools
        assert all(
            "state_key" not in t["function"]["parameters"]["properties"] for t in tools.values()
        )
        box.error("get_call_log", {}, "unknown_tool")
        box.error(
            "get_user_details",
            {"user_id": "x", "state_key": "tau2/retail/other"},
            "invalid_arguments",
        )
        box.error("calculate", {"expression": "9**9**9**9"}, "invalid_arguments")
        assert box.ok("calculate", expression="(2 + 3) * 4") == 20.0
        task = tau2.get_task("retail", tau2.SAMPLE_TASKS["retail"][0])
        before = box.state()["tau2"]["db_sha256"]
        for action in task.actions:
            assert box.call(action["name"], action["arguments"]).json["ok"], action
        after = box.state()["tau2"]
        assert before != after["db_sha256"] == tau2.expected_digest(task)
        entries = box.audit()
        assert [e["operation"] for e in entries][-len(task.actions) :] == [
            a["name"] for a in task.actions
        ]
        assert [e["mutating"] for e in entries[-len(task.actions) :]] == [
            a["name"] in {w["name"] for w in task.write_actions} for a in task.actions
        ]
        box.error(
            "cancel_pending_order",
            {"order_id": "#W0000000", "reason": "no longer needed"},
            "rejected",
        )


def test_tau2_tasks_load_with_their_gold_actions() -> None:
    for domain in tau2.DOMAINS:
        tasks = tau2.load_tasks(domain)
        every = tau2.load_tasks(domain, usable_only=False)
        assert 0 < len(tasks) < len(every)
        assert {t.id for t in tasks} >= set(tau2.SAMPLE_TASKS[domain])
        sample = tau2.get_task(domain, tau2.SAMPLE_TASKS[domain][0])
        assert sample.write_actions and tau2.policy(domain).strip() in sample.prompt
        assert sample.fixtures().tau2 is not None and sample.fixtures().services() == ["tau2"]
        # a null run leaves the bundled database: it fails the DB check
        null, errors = tau2.replay(domain, [])
        assert errors == [] and tau2.db_digest(null) != tau2.expected_digest(sample)
    assert len(tau2.load_tasks("retail", "test")) < len(tau2.load_tasks("retail"))
    with pytest.raises(tau2.Tau2TaskError):
        tau2.get_task("retail", "no-such-task")
    with pytest.raises(tau2.Tau2TaskError):
        tau2.load_tasks("airline", "no-such-split")
