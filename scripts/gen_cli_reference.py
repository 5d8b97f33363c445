"""Write docs/reference/cli.md from the ``orchard`` CLI's argparse parsers (``--check``: fail if stale).

The reference is generated, not written by hand, so it cannot drift from the
parsers: ``tests/cli/test_cli_reference.py`` runs ``--check``. The page is built
from the parsers' actions (flags, metavars, choices, defaults, help), not from
argparse's ``format_help()``, whose wrapping follows the terminal's width and
whose layout changes between Python versions: the same tree gives the same page
everywhere.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from orchard.cli import EXIT_CODES, _global_flags, build_parser

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "reference" / "cli.md"

HEADER = """# CLI reference

Generated from the parsers by `scripts/gen_cli_reference.py`; do not edit by hand
(`tests/cli/test_cli_reference.py` fails when this page is stale: run
`.venv/bin/python scripts/gen_cli_reference.py` after changing a command).

"""


def _global_dests() -> set[str]:
    probe = argparse.ArgumentParser(add_help=False)
    _global_flags.add(probe)
    return {a.dest for a in probe._actions}


GLOBAL_DESTS = _global_dests()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _positional(action: argparse.Action) -> str:
    name = _metavar(action)
    if action.nargs == "*":
        return f"[{name} ...]"
    if action.nargs == "+":
        return f"{name} [{name} ...]"
    if action.nargs == "?":
        return f"[{name}]"
    return name


def _flag(action: argparse.Action) -> str:
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flags
    return f"{flags} {_metavar(action)}"


def _default(action: argparse.Action) -> str:
    value = action.default
    if value in (None, argparse.SUPPRESS, False, [], "") or action.nargs == 0:
        return ""
    return f"`{value}`"


def _own_actions(parser: argparse.ArgumentParser, top: bool) -> list[argparse.Action]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if not top and action.dest in GLOBAL_DESTS and action.default is argparse.SUPPRESS:
            continue
        out.append(action)
    return out


def _usage(path: str, parser: argparse.ArgumentParser, top: bool) -> str:
    parts = [path]
    actions = _own_actions(parser, top)
    if any(a.option_strings and not a.required for a in actions):
        parts.append("[options]")
    parts += [_flag(a) for a in actions if a.option_strings and a.required]
    parts += [_positional(a) for a in actions if not a.option_strings]
    if any(name for name, _ in _global_flags.subparsers(parser)):
        parts.append("SUBCOMMAND ...")
    return " ".join(parts)


def _table(actions: list[argparse.Action]) -> list[str]:
    if not actions:
        return []
    lines = ["| argument | meaning | default |", "|---|---|---|"]
    for a in actions:
        name = _flag(a) if a.option_strings else _positional(a)
        meaning = a.help if a.help and a.help != argparse.SUPPRESS else ""
        if a.required and a.option_strings:
            meaning = f"(required) {meaning}"
        lines.append(f"| `{_cell(name)}` | {_cell(meaning)} | {_default(a)} |")
    return [*lines, ""]


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {c.dest: c.help or "" for c in action._choices_actions}
    return {}


def _sections(
    path: str, parser: argparse.ArgumentParser, help_text: str, depth: int
) -> Iterator[str]:
    top = depth == 1
    yield f"{'#' * min(depth + 1, 4)} `{path}`"
    yield ""
    if help_text:
        yield help_text[0].upper() + help_text[1:] + "."
        yield ""
    if parser.description and not top:
        yield _cell(parser.description)
        yield ""
    yield "```"
    yield _usage(path, parser, top)
    yield "```"
    yield ""
    yield from _table(_own_actions(parser, top))
    subs = list(_global_flags.subparsers(parser))
    helps = _helps(parser)
    if subs and not top:
        yield "Subcommands: " + ", ".join(f"`{name}`" for name, _ in subs) + "."
        yield ""
    for name, sub in subs:
        yield from _sections(f"{path} {name}", sub, helps.get(name, ""), depth + 1)


def render() -> str:
    # Some defaults are read from the environment (orchard up's --nice and
    # --data-plane-proxy): build the parsers without ORCHARD_* so the page shows the
    # code's defaults whatever the shell that runs this has set.
    saved = {k: v for k, v in os.environ.items() if k.startswith("ORCHARD_")}
    for key in saved:
        del os.environ[key]
    try:
        parser = build_parser()
    finally:
        os.environ.update(saved)
    lines = [HEADER.rstrip("\n"), ""]
    lines += [parser.description or "", ""]
    lines += [
        "The global flags below are accepted before or after the subcommand "
        "(`orchard --api-key K ls` and `orchard ls --api-key K` are the same); "
        "`orchard up` takes none of them. Every listing takes `--json`: one JSON object "
        "per line, the SDK's dataclass field for field.",
        "",
        "## Exit codes",
        "",
        "```",
        EXIT_CODES,
        "```",
        "",
    ]
    lines += list(_sections("orchard", parser, "", 1))
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(
                f"{TARGET.relative_to(ROOT)} is stale: run "
                ".venv/bin/python scripts/gen_cli_reference.py",
                file=sys.stderr,
            )
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text)
    print(TARGET.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
