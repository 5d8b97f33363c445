"""claw-bench's tasks as its wheel ships them: where they are, each task read and checked.

claw-bench 0.1.0 installs its tasks as data files (``<prefix>/share/claw-bench/tasks/<domain>/
<task-dir>/``: ``task.toml``, ``instruction.md``, ``environment/setup.sh`` and ``data/``,
``solution/solve.sh``, ``verifier/test_output.py`` and its fixtures, one ``conftest.py`` for all),
not inside its import package; its own CLI looks for them beside its source tree
(``cli/oracle.py``'s ``_find_tasks_root``), which an installed wheel does not have. So the root
is found from the distribution's RECORD (:mod:`importlib.metadata`), and every ``task.toml`` is
parsed by claw-bench's own ``load_task`` (its pydantic ``TaskConfig``).

Not claw-bench's ``load_all_tasks``: it skips a task whose ``task.toml`` does not parse
(``except Exception: continue``) and keys tasks by id (a repeated id hides one). Here every task
folder yields a :class:`BenchTask` or a :class:`Malformed` saying why, so the triage accounts
for each one. Hostile-input rules: a symlink, a file over :data:`MAX_FILE_BYTES` or a script
that is not UTF-8 makes the task malformed, never silently dropped. ``__pycache__`` folders are
left out: pip byte-compiles the wheel's data ``.py`` files at install, they are not task content.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

DISTRIBUTION = "claw-bench"
MAX_FILE_BYTES = 4 * 1024 * 1024
SKIPPED_DIRS = frozenset({"__pycache__"})


class SourceError(RuntimeError):
    """claw-bench is not installed, or its tasks folder is not where its RECORD says."""


@dataclass(frozen=True)
class BenchTask:
    """One claw-bench task, read whole: ``rel`` is ``<domain-folder>/<task-folder>``; files are
    keyed by their path inside the task folder (``environment/data/email.txt``)."""

    id: str
    domain: str
    level: str
    title: str
    description: str
    timeout: int
    capabilities: tuple[str, ...]
    tags: tuple[str, ...]
    rel: str
    instruction: str
    environment: Mapping[str, bytes]
    solution: str
    verifier: Mapping[str, bytes]
    conftest: bytes = field(repr=False)

    @property
    def has_data(self) -> bool:
        return any(p.startswith("environment/data/") for p in self.environment)


@dataclass(frozen=True)
class Malformed:
    """A task folder that is not a runnable task, and why."""

    rel: str
    id: str
    reason: str


def version() -> str:
    """The installed claw-bench's version."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise SourceError(
            "claw-bench is not installed: pip install 'orchard-env[claw]' (claw-bench from PyPI)"
        ) from None


def tasks_root() -> Path:
    """The installed wheel's ``share/claw-bench/tasks`` folder (found through its RECORD)."""
    version()
    dist = importlib.metadata.distribution(DISTRIBUTION)
    for entry in dist.files or ():
        parts = entry.parts
        if parts[-3:] == ("claw-bench", "tasks", "conftest.py") and "share" in parts:
            root = Path(str(dist.locate_file(entry))).resolve().parent
            if root.is_dir():
                return root
            raise SourceError(f"claw-bench's RECORD names {root}, which is not a folder")
    raise SourceError("claw-bench's RECORD lists no share/claw-bench/tasks/conftest.py")


def _files(folder: Path, rel_to: Path, problems: list[str]) -> Iterator[tuple[str, bytes]]:
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(rel_to)
        if SKIPPED_DIRS.intersection(rel.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            problems.append(f"{rel} is a symlink")
        elif path.is_file():
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                problems.append(f"{rel} is {size} bytes (over {MAX_FILE_BYTES})")
            else:
                yield rel.as_posix(), path.read_bytes()


def _text(data: bytes | None, name: str, problems: list[str]) -> str:
    if data is None:
        problems.append(f"no {name}")
        return ""
    try:
        return data.decode()
    except UnicodeDecodeError as err:
        problems.append(f"{name} is not UTF-8: {err}")
        return ""


def read_task(folder: Path, conftest: bytes) -> BenchTask | Malformed:
    """One task folder (``<root>/<domain>/<task>``) read whole, or why it cannot be."""
    from claw_bench.core.task_loader import load_task
    from pydantic import ValidationError

    rel = f"{folder.parent.name}/{folder.name}"
    try:
        config = load_task(folder)
    except FileNotFoundError:
        return Malformed(rel, folder.name, "no task.toml")
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(task)"
        return Malformed(rel, folder.name, f"task.toml: {where}: {first['msg']}")
    except Exception as err:  # tomli's TOMLDecodeError, an unreadable file: the task's fault
        return Malformed(rel, folder.name, f"task.toml: {type(err).__name__}: {err}")
    problems: list[str] = []
    files = dict(_files(folder, folder, problems))
    instruction = _text(files.get("instruction.md"), "instruction.md", problems)
    solution = _text(files.get("solution/solve.sh"), "solution/solve.sh", problems)
    if "verifier/test_output.py" not in files:
        problems.append("no verifier/test_output.py")
    if "environment/setup.sh" not in files:
        problems.append("no environment/setup.sh")
    if problems:
        return Malformed(rel, config.id, "; ".join(problems))
    return BenchTask(
        id=config.id, domain=config.domain, level=config.level, title=config.title,
        description=config.description, timeout=config.timeout,
        capabilities=tuple(config.capabilities), tags=tuple(config.tags), rel=rel,
        instruction=instruction,
        environment={p: b for p, b in files.items() if p.startswith("environment/")},
        solution=solution,
        verifier={p: b for p, b in files.items() if p.startswith("verifier/")},
        conftest=conftest,
    )  # fmt: skip


@dataclass
class Catalogue:
    """Every task folder of a tasks root: the readable tasks and the malformed ones."""

    root: Path
    version: str
    tasks: list[BenchTask]
    malformed: list[Malformed]

    @property
    def total(self) -> int:
        return len(self.tasks) + len(self.malformed)

    def by_id(self) -> dict[str, BenchTask]:
        return {t.id: t for t in self.tasks}


def load_catalogue(root: Path | None = None) -> Catalogue:
    """Every task under ``root`` (default: the installed wheel's), sorted by folder; a second
    task with an id already seen is malformed (claw-bench's own loader would hide one)."""
    root = root or tasks_root()
    conftest_path = root / "conftest.py"
    if not conftest_path.is_file():
        raise SourceError(f"{root} has no conftest.py (the verifiers' --workspace option)")
    conftest = conftest_path.read_bytes()
    tasks: list[BenchTask] = []
    malformed: list[Malformed] = []
    seen: dict[str, str] = {}
    for domain in sorted(p for p in root.iterdir() if p.is_dir()):
        if domain.name.startswith(("_", ".")) or domain.name in SKIPPED_DIRS:
            continue  # _schema: the task.toml JSON schema, not a domain
        for folder in sorted(p for p in domain.iterdir() if p.is_dir()):
            if folder.name in SKIPPED_DIRS:
                continue
            found = read_task(folder, conftest)
            if isinstance(found, BenchTask) and found.id in seen:
                found = Malformed(found.rel, found.id, f"id {found.id} repeats {seen[found.id]}")
            if isinstance(found, BenchTask):
                seen[found.id] = found.rel
                tasks.append(found)
            else:
                malformed.append(found)
    return Catalogue(root, version(), tasks, malformed)
