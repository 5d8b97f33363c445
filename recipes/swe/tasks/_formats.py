"""Per dataset: the row model and how a validated row becomes a :class:`SweTask`.

What a row does not say is decided here, once, per dataset: the image (``_images``), the
work directory (``/testbed`` for the SWE-bench family, ``/<repo name>`` for SWE-rebench V2,
the row's own for Scale-SWE), the test command (the row's ``install_config.test_cmd``; the
SWE-bench family and Scale-SWE carry none: the caller's ``test_cmd`` template, else Scale-SWE
runs pytest on the files its test ids name and SWE-bench rows stay ungradable) and the test
patch (Scale-SWE's ``f2p_script`` becomes a patch adding ``test_fail_to_pass.py``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from ._images import swe_gym_image, swebench_image
from ._rows import (
    OrchardRow,
    Row,
    ScaleSweRow,
    SweBenchRow,
    SweBenchVerifiedRow,
    SweGymRow,
    SweRebenchRow,
    SweRebenchV2Row,
)
from ._task import SweTask

SCALE_SWE_SCRIPT = "test_fail_to_pass.py"


def patch_files(patch: str) -> list[str]:
    """The files a unified diff touches (the new side; the old one for a deletion), in
    order, once each; paths with spaces kept whole."""
    seen: dict[str, None] = {}
    old = ""
    for line in patch.splitlines():
        if line.startswith("--- "):
            old = _diff_path(line[4:], "a/")
        elif line.startswith("+++ "):
            new = _diff_path(line[4:], "b/")
            path = old if new == "/dev/null" else new
            if path and path != "/dev/null":
                seen.setdefault(path, None)
    return list(seen)


def _diff_path(text: str, prefix: str) -> str:
    path = text.split("\t")[0].rstrip()
    if len(path) > 1 and path[0] == path[-1] == '"':
        path = path[1:-1]
    return path[len(prefix) :] if path.startswith(prefix) else path


def new_file_patch(path: str, text: str) -> str:
    """A git diff that creates ``path`` with ``text``."""
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    if text and not text.endswith("\n"):
        body += "\\ No newline at end of file\n"
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def fill_test_cmd(template: str, test_patch: str, test_ids: list[str]) -> str:
    """``{test_files}`` in ``template`` = the test patch's files (else the test ids' files),
    shell-quoted: what swebench's ``get_test_directives`` hands pytest."""
    files = patch_files(test_patch) or sorted({t.split("::")[0] for t in test_ids if "::" in t})
    return template.replace("{test_files}", " ".join(shlex.quote(f) for f in files))


def _metadata(row: BaseModel, used: set[str]) -> dict[str, Any]:
    data = row.model_dump(mode="json")
    return {k: v for k, v in data.items() if k not in used}


_COMMON = {"instance_id", "problem_statement", "patch", "FAIL_TO_PASS", "PASS_TO_PASS"}
_SWEBENCH = _COMMON | {"repo", "base_commit", "test_patch", "version"}


def _swebench_family(
    row: SweBenchRow, dataset: str, image: str, test_cmd: str | None, workdir: str = "/testbed"
) -> SweTask:
    commands: tuple[str, ...] = ()
    log_parser = ""
    used = set(_SWEBENCH)
    config = getattr(row, "install_config", None)
    if config is not None:
        commands = tuple(config.test_cmd)
        log_parser = config.log_parser or ""
        used.add("install_config")
    if test_cmd is not None:
        commands = (fill_test_cmd(test_cmd, row.test_patch, row.FAIL_TO_PASS),)
    return SweTask(
        instance_id=row.instance_id,
        dataset=dataset,
        problem_statement=row.problem_statement,
        image=image,
        workdir=workdir,
        fail_to_pass=tuple(row.FAIL_TO_PASS),
        pass_to_pass=tuple(row.PASS_TO_PASS),
        test_patch=row.test_patch,
        gold_patch=row.patch,
        repo=row.repo,
        base_commit=row.base_commit,
        version=row.version,
        test_cmd=commands,
        log_parser=log_parser,
        metadata=_metadata(row, used | {"image_name", "docker_image"}),
    )


def _swebench(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, SweBenchRow)
    return _swebench_family(row, "swe-bench", swebench_image(row.instance_id), test_cmd)


def _verified(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, SweBenchVerifiedRow)
    return _swebench_family(row, "swe-bench-verified", swebench_image(row.instance_id), test_cmd)


def _swe_gym(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, SweGymRow)
    return _swebench_family(row, "swe-gym", swe_gym_image(row.instance_id), test_cmd)


def _rebench(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, SweRebenchRow)
    image = row.docker_image or row.image_name or swebench_image(row.instance_id, "swerebench")
    return _swebench_family(row, "swe-rebench", image, test_cmd)


def _rebench_v2(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, SweRebenchV2Row)
    workdir = "/" + row.repo.split("/", 1)[1]
    return _swebench_family(row, "swe-rebench-v2", row.image_name, test_cmd, workdir)


def _scale_swe(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, ScaleSweRow)
    if row.f2p_patch:
        test_patch = row.f2p_patch
    elif row.f2p_script:
        test_patch = new_file_patch(SCALE_SWE_SCRIPT, row.f2p_script)
    else:
        raise ValueError("f2p_patch: empty, and so is f2p_script: the row has no tests to add")
    template = test_cmd or "python -m pytest -rA {test_files}"
    ids = row.FAIL_TO_PASS + row.PASS_TO_PASS
    files = sorted({t.split("::")[0] for t in ids if "::" in t})
    command = (
        template.replace("{test_files}", " ".join(shlex.quote(f) for f in files))
        if files
        else fill_test_cmd(template, test_patch, ids)
    )
    return SweTask(
        instance_id=row.instance_id,
        dataset="scale-swe",
        problem_statement=row.problem_statement,
        image=row.image_url,
        workdir=row.workdir,
        fail_to_pass=tuple(row.FAIL_TO_PASS),
        pass_to_pass=tuple(row.PASS_TO_PASS),
        test_patch=test_patch,
        gold_patch=row.patch,
        repo=f"{row.user}/{row.repo}",
        base_commit=row.parent_commit,
        test_cmd=(command,),
        pre_commands=tuple(row.pre_commands),
        metadata=_metadata(
            row,
            _COMMON
            | {
                "user",
                "repo",
                "workdir",
                "image_url",
                "parent_commit",
                "f2p_patch",
                "pre_commands",
            },
        ),
    )


def _orchard(row: Row, test_cmd: str | None) -> SweTask:
    assert isinstance(row, OrchardRow)
    task = _swebench_family(row, "orchard", row.image, test_cmd, row.workdir)
    return replace(
        task,
        pre_commands=tuple(row.pre_commands),
        repo_files=dict(row.repo_files),
        metadata={
            k: v
            for k, v in task.metadata.items()
            if k not in ("image", "workdir", "pre_commands", "repo_files")
        },
    )


@dataclass(frozen=True)
class Format:
    name: str
    model: type[Row]
    normalize: Callable[[Row, str | None], SweTask]
    image_field: str | None
    """The row field the image comes from (None: the dataset's naming scheme)."""


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("swe-bench", SweBenchRow, _swebench, None),
        Format("swe-bench-verified", SweBenchVerifiedRow, _verified, None),
        Format("swe-gym", SweGymRow, _swe_gym, None),
        Format("swe-rebench", SweRebenchRow, _rebench, "docker_image"),
        Format("swe-rebench-v2", SweRebenchV2Row, _rebench_v2, "image_name"),
        Format("scale-swe", ScaleSweRow, _scale_swe, "image_url"),
        Format("orchard", OrchardRow, _orchard, "image"),
    )
}
