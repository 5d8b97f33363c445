"""An SWE task row (SWE-bench, SWE-rebench, Scale-SWE shapes) read into one typed record.

Rows arrive in several shapes: fields at the top level or under ``metadata``;
``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as lists or as JSON strings of lists;
``install_config`` as a dict or a JSON string; the image as ``image``,
``image_url`` or ``image_name``. Anything malformed raises
:class:`InstanceError` with the field's name (the service turns it into
INVALID_ARGUMENT).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .grading import EvalType
from .parsers import UnknownParserError, parser_for
from .policy import PolicyError, RewardPolicy, parse_policy

DEFAULT_WORKDIR = "/testbed"
MAX_TESTS = 100_000


class InstanceError(ValueError):
    """The instance row is malformed; the message names the field."""


@dataclass(frozen=True)
class SweInstance:
    instance_id: str
    image: str
    test_cmd: str
    log_parser: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    test_patch: str = ""
    repo: str = ""
    base_commit: str = ""
    version: str = ""
    workdir: str = DEFAULT_WORKDIR
    pre_commands: list[str] = field(default_factory=list)
    eval_type: EvalType = EvalType.PASS_AND_FAIL
    gold_patch: str = ""
    problem_statement: str = ""
    repo_files: dict[str, str] = field(default_factory=dict)
    """Orchard extension for images that lack the repository: files (relative to
    ``workdir``) written and committed as the base before the patch is applied."""
    reward_policy: RewardPolicy = field(default_factory=RewardPolicy)
    """Which integrity findings take the reward away (the dataset's ``reward_policy``)."""


def swebench_image(instance_id: str) -> str:
    """The public SWE-bench eval image's name for an instance."""
    return f"swebench/sweb.eval.x86_64.{instance_id.replace('__', '_1776_')}:latest"


def _json_or_value(value: Any, name: str) -> Any:
    if isinstance(value, str | bytes) and name != "test_cmd":
        text = value.decode() if isinstance(value, bytes) else value
        stripped = text.strip()
        if stripped[:1] in ("[", "{"):
            try:
                return json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise InstanceError(f"{name}: not valid JSON ({exc.msg})") from None
    return value


def _test_ids(row: Mapping[str, Any], name: str) -> list[str]:
    value = _json_or_value(row.get(name, []), name)
    if value is None or value == "":
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise InstanceError(f"{name}: must be a list of test ids (or a JSON string of one)")
    if len(value) > MAX_TESTS:
        raise InstanceError(f"{name}: {len(value)} ids is over the limit of {MAX_TESTS}")
    return list(value)


def _text(row: Mapping[str, Any], name: str, default: str = "") -> str:
    value = row.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InstanceError(f"{name}: must be a string")
    return value


def _commands(value: Any, name: str) -> list[str]:
    value = _json_or_value(value, name)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise InstanceError(f"{name}: must be a string or a list of strings")
    return list(value)


def parse_instance(raw: Mapping[str, Any] | str) -> SweInstance:
    """Read a row (a mapping or its JSON text) into a :class:`SweInstance`."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InstanceError(f"instance: not valid JSON ({exc.msg})") from None
    if not isinstance(raw, Mapping):
        raise InstanceError("instance: must be a JSON object")
    row: dict[str, Any] = dict(raw)
    metadata = _json_or_value(row.get("metadata"), "metadata")
    if isinstance(metadata, Mapping):
        row = {**row, **metadata}  # the nested shape: {problem_statement, patch, metadata{...}}
    instance_id = _text(row, "instance_id")
    if not instance_id:
        raise InstanceError("instance_id: required")
    config = _json_or_value(row.get("install_config") or {}, "install_config")
    if not isinstance(config, Mapping):
        raise InstanceError("install_config: must be an object (or a JSON string of one)")
    test_cmd = config.get("test_cmd") or row.get("test_cmd")
    test_cmd_list = _commands(test_cmd, "install_config.test_cmd")
    if not test_cmd_list:
        raise InstanceError("install_config.test_cmd: required (the command that runs the tests)")
    try:
        log_parser = parser_for(
            config.get("log_parser") or row.get("log_parser"), _text(row, "repo")
        )
    except UnknownParserError as exc:
        raise InstanceError(f"install_config.log_parser: {exc.args[0]}") from None
    image = (
        _text(row, "image") or _text(row, "image_url") or _text(row, "image_name")
    ) or swebench_image(instance_id)
    eval_type_text = _text(row, "eval_type") or config.get("eval_type") or "pass_and_fail"
    try:
        eval_type = EvalType(eval_type_text)
    except ValueError:
        raise InstanceError(f"eval_type: must be one of {[e.value for e in EvalType]}") from None
    return SweInstance(
        instance_id=instance_id,
        image=image,
        test_cmd=" && ".join(test_cmd_list) if len(test_cmd_list) > 1 else test_cmd_list[0],
        log_parser=log_parser,
        fail_to_pass=_test_ids(row, "FAIL_TO_PASS"),
        pass_to_pass=_test_ids(row, "PASS_TO_PASS"),
        test_patch=_text(row, "test_patch"),
        repo=_text(row, "repo"),
        base_commit=_text(row, "base_commit"),
        version=str(row.get("version") or ""),
        workdir=_text(row, "workdir") or DEFAULT_WORKDIR,
        pre_commands=_commands(
            row.get("pre_commands") or config.get("pre_install"), "pre_commands"
        ),
        eval_type=eval_type,
        gold_patch=_text(row, "patch"),
        problem_statement=_text(row, "problem_statement"),
        repo_files=_repo_files(row.get("repo_files")),
        reward_policy=_policy(row.get("reward_policy")),
    )


def _policy(value: Any) -> RewardPolicy:
    try:
        return parse_policy(_json_or_value(value, "reward_policy"))
    except PolicyError as exc:
        raise InstanceError(str(exc)) from None


def _repo_files(value: Any) -> dict[str, str]:
    value = _json_or_value(value, "repo_files")
    if not value:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InstanceError("repo_files: must map relative paths to file contents")
    for path in value:
        if path.startswith("/") or ".." in path.split("/") or not path:
            raise InstanceError(f"repo_files: {path!r} must be a relative path inside workdir")
    return dict(value)
