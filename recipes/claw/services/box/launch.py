"""Start the in-sandbox services: ``python3 -I <dir>/launch.py serve --port N`` (the secret
on stdin), ``... mcp --base URL [--port N]`` (the MCP server; stdio without ``--port``) or
``... call --base URL <tool> <json>`` (the ``claw`` shell command).

Run as a script with ``-I`` (no ``PYTHON*`` variables, no user site: the agent's
environment does not reach us): it puts the folder holding this package, and the runtime's
``site`` folder beside it if there is one, first on ``sys.path``, then imports the package
by its folder's name (``claw_box`` in the sandbox, ``box`` in the source tree).
"""

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
PACKAGE = os.path.basename(HERE)


def main() -> None:
    site = os.path.join(TOP, "site")
    sys.path[:0] = [TOP] + ([site] if os.path.isdir(site) else [])
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "serve":
        importlib.import_module(f"{PACKAGE}.server").main(sys.argv[2:])
    elif command == "mcp":
        importlib.import_module(f"{PACKAGE}.mcp_server").main(sys.argv[2:])
    elif command == "call":
        raise SystemExit(importlib.import_module(f"{PACKAGE}.cli").main(sys.argv[2:]))
    else:
        print(
            "usage: launch.py serve --port N | mcp --base URL [--port N] | call --base URL ...",
            file=sys.stderr,
        )
        raise SystemExit(2)


if __name__ == "__main__":
    main()
