"""``claw``: the services from a shell in the sandbox (the default image has no ``curl``).

    claw tools                         the tools, one a line: name(arguments): description
    claw <tool> '<JSON arguments>'     one call; the JSON answer on stdout (exit 1 if not ok)
    claw <tool> -                      the arguments read from stdin

A harness whose agent has only a shell tool (Codex's ``exec_command``, OpenClaw's ``exec``)
reaches the services with it; each call is ``POST /v1/tools/<tool>`` (channel ``http``).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request

USAGE = "usage: claw tools | claw <tool> '<JSON arguments>' | claw <tool> -"


def _request(base: str, path: str, body: bytes | None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        base.rstrip("/") + path,
        data=body,
        method="POST" if body is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--base":
        print(USAGE, file=sys.stderr)
        return 2
    base, args = argv[1], argv[2:]
    try:
        if args[0] == "tools":
            _, data = _request(base, "/v1/tools", None)
            for tool in json.loads(data)["tools"]:
                fn = tool["function"]
                params = ", ".join(fn["parameters"].get("properties", {}))
                print(f"{fn['name']}({params}): {fn.get('description', '')}")
            return 0
        if len(args) > 2:
            print(USAGE, file=sys.stderr)
            return 2
        body = (
            sys.stdin.buffer.read()
            if args[1:] == ["-"]
            else (args[1] if len(args) > 1 else "{}").encode()
        )
        _, data = _request(base, "/v1/tools/" + urllib.parse.quote(args[0], safe=""), body)
    except OSError as err:
        print(f"claw: the services do not answer at {base}: {err}", file=sys.stderr)
        return 3
    sys.stdout.write(data.decode("utf-8", "replace") + "\n")
    try:
        return 0 if json.loads(data).get("ok") else 1
    except (ValueError, AttributeError):
        return 1
