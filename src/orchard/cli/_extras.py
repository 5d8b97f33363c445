"""Which of the package's extras a server command needs, checked before it starts anything.

``pip install orchard-env`` is the SDK and the client commands alone; the
services' packages sit behind extras (``[server]``, ``[rewards]``, ...). Without
this check ``orchard up`` would start children that die on an ImportError deep
in their own logs. What an extra holds is read from the installed
distribution's metadata (pyproject.toml stays the one source), not listed here
again. A source tree put on ``sys.path`` by hand has no metadata: then nothing
can be checked and the command goes on (its children's logs say what is
missing).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Sequence

from orchard.client import ConfigurationError

DISTRIBUTION = "orchard-env"

# "name[extras] (spec) ; marker" as Requires-Dist writes it (PEP 508). Our extras
# carry no marker but their own `extra == "..."`.
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*(?:;(.*))?$")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_requirements(extra: str, requires: Sequence[str]) -> list[str]:
    """The distribution names that ``extra`` adds, from Requires-Dist lines."""
    names = []
    for line in requires:
        match = _REQUIREMENT.match(line)
        if match is None:
            raise ConfigurationError(f"{DISTRIBUTION}'s metadata: unreadable requirement {line!r}")
        if extra in _EXTRA.findall(match.group(2) or ""):
            names.append(match.group(1))
    return names


def missing(extras: Sequence[str]) -> list[str]:
    """The distributions ``extras`` need that are not installed (sorted, unique)."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    absent = set()
    for extra in extras:
        for name in extra_requirements(extra, requires):
            try:
                importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                absent.add(name)
    return sorted(absent)


def require(command: str, extras: Sequence[str]) -> None:
    """Raise :class:`ConfigurationError` naming the pip command when ``extras`` are missing."""
    absent = missing(extras)
    if absent:
        raise ConfigurationError(
            f"{command} runs the services, which need more than the SDK: "
            f"pip install '{DISTRIBUTION}[{','.join(extras)}]' (missing: {', '.join(absent)})"
        )
