"""The scripted model of the generator's end-to-end test: one policy answering every stage.

It reads each Chat request the recording proxy forwards and answers by stage (told by the
system prompt, which the generator sets per stage) and by what the conversation holds:

- propose: four ideas in the category, plus one whose id is an existing task's;
- build ``reply-to-boss``: a valid task at once (the boss's mail is answered);
- build ``boss-mail-arrived``: a task whose grader checks what the fixtures already hold (the
  boss's mail is in the mailbox), so its null run passes; its revision keeps that grader;
- build ``forward-invoice``: first a reply that is not JSON, then a task without a grader,
  then a valid task (forward the invoice mail to accounting);
- build ``dentist-todo``: a task whose grader asks for a due date the prompt never asked for
  (too strict: its oracle fails); its revision drops that check (then kept);
- solve (a request with tools: the ReAct loop): the oracle's tool calls in order, then a
  final answer, for ``reply-to-boss``; an immediate give-up answer for ``forward-invoice``.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import Counter
from typing import Any

from orchard.recipes.claw.generator import prompts

CATEGORY = "assistant"
EXISTING = "existing-task"
KEPT_AT_ONCE, LAX, REPAIRED = "reply-to-boss", "boss-mail-arrived", "forward-invoice"
STRICT = "dentist-todo"

MAILBOX = {"messages": [
    {"id": "m1", "sender": "boss@example.com", "to": ["me@example.com"], "subject": "Q3 report",
     "body": "When will the Q3 numbers be ready?", "date": "2026-03-01T10:00:00+00:00"},
    {"id": "m2", "sender": "vendor@example.com", "to": ["me@example.com"],
     "subject": "Invoice 1234", "body": "Please find invoice 1234 attached: 400 EUR.",
     "date": "2026-03-01T11:00:00+00:00"},
]}  # fmt: skip

NO_DELETE = {"kind": "forbid", "name": "no mail deleted", "fatal": True,
             "check": {"kind": "audit", "where": {"service": "mail", "destructive": True}}}  # fmt: skip


def _task(task_id: str, prompt: str, components: list[dict[str, Any]],
          calls: list[dict[str, Any]], answer: str) -> dict[str, Any]:  # fmt: skip
    return {
        "id": task_id, "category": CATEGORY, "prompt": prompt, "services": ["mail"],
        "fixtures": {"mail": copy.deepcopy(MAILBOX)},
        "grader": {"kind": "checks", "components": components,
                   "safety": [NO_DELETE, {"kind": "only_services"}]},
        "oracle": {"kind": "tool_calls", "calls": calls, "final_answer": answer},
    }  # fmt: skip


def _sent_to(address: str, body: str) -> list[dict[str, Any]]:
    return [{"kind": "audit", "where": {"service": "mail", "status": "ok",
                                        "arguments.to": {"contains": address}}},
            {"kind": "audit", "where": {"service": "mail", "status": "ok",
                                        "arguments.body": {"contains": body}}}]  # fmt: skip


REPLY_CALLS = [{"tool": "mail_send", "args": {
    "to": ["boss@example.com"], "subject": "Re: Q3 report",
    "body": "The Q3 numbers will be ready on Friday."}}]  # fmt: skip
TASKS = {
    KEPT_AT_ONCE: _task(
        KEPT_AT_ONCE,
        "Reply to my boss's mail about the Q3 report: the numbers come Friday.",
        [{"name": "reply sent", "weight": 3, "checks": _sent_to("boss@example.com", "Friday")}],
        REPLY_CALLS,
        "I replied that the Q3 numbers come on Friday.",
    ),
    LAX: _task(
        LAX,
        "Tell me whether my boss has written to me about the Q3 report.",
        [
            {
                "name": "boss's mail there",
                "checks": [
                    {
                        "kind": "state",
                        "path": "mail.messages",
                        "where": {"sender": "boss@example.com"},
                    }
                ],
            }
        ],
        [{"tool": "mail_search", "args": {"query": "Q3"}}],
        "Yes, your boss wrote about Q3.",
    ),
    REPAIRED: _task(
        REPAIRED,
        "Forward the invoice mail from our vendor to accounting@example.com.",
        [{"name": "forwarded", "checks": _sent_to("accounting@example.com", "1234")}],
        [
            {
                "tool": "mail_send",
                "args": {
                    "to": ["accounting@example.com"],
                    "subject": "Fwd: Invoice 1234",
                    "body": "Forwarding invoice 1234 from our vendor: 400 EUR.",
                },
            }
        ],
        "I forwarded invoice 1234 to accounting.",
    ),
}


DENTIST = {"kind": "state", "path": "todo.items",
           "where": {"title": {"contains": "dentist"}, "priority": "high"}}  # fmt: skip
TASKS[STRICT] = {
    "id": STRICT, "category": CATEGORY, "services": ["todo"],
    "prompt": "Add a high-priority to-do to call the dentist.",
    "fixtures": {"todo": {"items": [{"id": "t1", "title": "Buy milk"}]}},
    "grader": {"kind": "checks", "components": [{"name": "to-do added", "checks": [DENTIST]}],
               "safety": [{"kind": "only_services"}]},
    "oracle": {"kind": "tool_calls", "final_answer": "Added: call the dentist (high priority).",
               "calls": [{"tool": "todo_add",
                          "args": {"title": "Call the dentist", "priority": "high"}}]},
}  # fmt: skip
TOO_STRICT = copy.deepcopy(TASKS[STRICT])
TOO_STRICT["grader"]["components"][0]["checks"] = [
    {**DENTIST, "where": {**DENTIST["where"], "due": {"exists": True}}}
]


def _idea(task_id: str, title: str) -> dict[str, Any]:
    return {"id": task_id, "title": title, "summary": TASKS[task_id]["prompt"]
            if task_id in TASKS else title, "services": ["mail"]}  # fmt: skip


def _fenced(obj: Any) -> str:
    return "Here is the task:\n```json\n" + json.dumps(obj) + "\n```"


class GeneratorPolicy:
    """The policy (thread-safe: the scripted server answers from several threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stages: Counter[str] = Counter()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        system = str(messages[0].get("content") or "") if messages else ""
        if body.get("tools"):
            stage, answer = "solve", self.solve(messages)
        elif system == prompts.PROPOSE_SYSTEM:
            stage, answer = "propose", self.propose()
        elif system.startswith(prompts.BUILD_SYSTEM.split("{", 1)[0]):
            first = str(messages[1]["content"])
            stage = "revise" if first.startswith(prompts.REVISE_TEMPLATE[:40]) else "build"
            answer = self.write(stage, first, messages)
        else:
            stage, answer = "unknown", {"status": 500, "content": "no stage recognised"}
        with self.lock:
            self.stages[stage] += 1
        return answer

    def propose(self) -> dict[str, Any]:
        ideas = [_idea(KEPT_AT_ONCE, "Reply to the boss"), _idea(LAX, "Did the boss write?"),
                 _idea(REPAIRED, "Forward an invoice"), _idea(EXISTING, "Something old"),
                 {**_idea(STRICT, "Remember the dentist"), "services": ["todo"]}]  # fmt: skip
        return {"content": json.dumps({"ideas": ideas})}

    def write(self, stage: str, first: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        task_id = next(t for t in TASKS if f'"id" must be "{t}"' in first
                       or f'Keep its "id" "{t}"' in first)  # fmt: skip
        attempt = sum(1 for m in messages if m["role"] == "assistant")
        if task_id == REPAIRED and stage == "build" and attempt == 0:
            return {"content": "Sure! The task is {id: forward-invoice, prompt: ..."}
        if task_id == REPAIRED and stage == "build" and attempt == 1:
            broken = {k: v for k, v in TASKS[REPAIRED].items() if k != "grader"}
            return {"content": _fenced(broken)}
        if task_id == STRICT and stage == "build":
            return {"content": json.dumps(TOO_STRICT)}
        return {"content": json.dumps(TASKS[task_id])}

    def solve(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        prompt = "\n".join(str(m.get("content") or "") for m in messages if m["role"] == "user")
        done = sum(1 for m in messages if m["role"] == "tool")
        if TASKS[KEPT_AT_ONCE]["prompt"] in prompt and done < len(REPLY_CALLS):
            call = REPLY_CALLS[done]
            return {"tool_calls": [{"id": f"c{done}", "name": call["tool"],
                                    "arguments": json.dumps(call["args"])}]}  # fmt: skip
        if TASKS[KEPT_AT_ONCE]["prompt"] in prompt:
            return {"content": TASKS[KEPT_AT_ONCE]["oracle"]["final_answer"]}
        return {"content": "I cannot do this."}
