"""The public datasets' row schemas, one pydantic model each, as their cards and loaders give them.

Why pydantic: every row must be checked field by field with an error that names the field
(``loc``), and the datasets disagree on types (``FAIL_TO_PASS`` a JSON string in SWE-bench,
a list in SWE-Gym and SWE-rebench; ``install_config`` a struct or a JSON string;
``created_at`` a string or epoch milliseconds). Models declare what each dataset holds;
fields a dataset adds later are kept (``extra="allow"``) and carried into the task's
``metadata`` rather than refused.

Sources (read for the field lists, not copied):

- SWE-bench / Lite / Verified (``SWE-bench/SWE-bench*`` on the Hub): ``repo, instance_id,
  base_commit, patch, test_patch, problem_statement, hints_text, created_at, version,
  FAIL_TO_PASS, PASS_TO_PASS, environment_setup_commit`` (the test lists as JSON strings);
  Verified adds ``difficulty``.
- SWE-Gym (``SWE-Gym/SWE-Gym``): the SWE-bench fields without ``environment_setup_commit``,
  the test lists as sequences.
- SWE-rebench v1 (``nebius/SWE-rebench``): the SWE-bench fields plus ``meta``,
  ``install_config`` (``test_cmd`` a string, ``log_parser``, ``install``, ``pip_packages`` ...),
  ``requirements``, ``environment``, ``license_name`` and the image as ``docker_image``
  (later rows also ``image_name``).
- SWE-rebench V2 (``nebius/SWE-rebench-V2``, ``sample.json`` in its repository): ``language``,
  ``interface``, ``pr_description``, ``meta.llm_metadata``, ``created_at`` in epoch ms,
  ``install_config.test_cmd`` a list and ``log_parser`` named, ``image_name`` required; the
  repository sits at ``/<repo name>`` in the image (its ``scripts/eval.py``).
- Scale-SWE (``AweAI-Team/Scale-SWE-Data``): ``instance_id`` (``{user}_{repo}_pr{id}``),
  ``user``, ``repo`` (the name alone), ``language``, ``workdir``, ``image_url``, ``patch``,
  ``pr_commit``, ``parent_commit``, ``problem_statement``, ``f2p_patch``, ``f2p_script``
  (a reproduction test written as ``test_fail_to_pass.py`` when there is no test patch),
  ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``github_url``, ``pre_commands``; no test command.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

MAX_TEST_IDS = 100_000


def _json_if_text(value: Any) -> Any:
    """A JSON string of a list or an object (as SWE-bench and Parquet exports store them)."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg} at char {exc.pos})") from None
    return value


def _test_ids(value: Any) -> Any:
    value = _json_if_text(value)
    if value is None or value == "":
        return []
    if hasattr(value, "tolist"):  # a numpy array out of a Parquet reader
        value = value.tolist()
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and len(value) > MAX_TEST_IDS:
        raise ValueError(f"{len(value)} test ids is over the limit of {MAX_TEST_IDS}")
    return value


def _commands(value: Any) -> Any:
    value = _json_if_text(value)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    return value


def _text_or_epoch(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if hasattr(value, "isoformat"):  # a timestamp column
        return value.isoformat()
    return value


TestIds = Annotated[list[str], BeforeValidator(_test_ids)]
Commands = Annotated[list[str], BeforeValidator(_commands)]
JsonObject = Annotated[dict[str, Any], BeforeValidator(_json_if_text)]
Timestamp = Annotated[str, BeforeValidator(_text_or_epoch)]
Id = Annotated[str, Field(min_length=1, max_length=512)]


class Row(BaseModel):
    """Fields every format has; ``extra="allow"`` keeps the rest for the task's metadata."""

    model_config = ConfigDict(extra="allow", frozen=True, str_strip_whitespace=False)

    instance_id: Id
    problem_statement: str = Field(min_length=1)
    patch: str = ""
    FAIL_TO_PASS: TestIds
    PASS_TO_PASS: TestIds = Field(default_factory=list)

    @field_validator("instance_id")
    @classmethod
    def _no_path_characters(cls, value: str) -> str:
        if any(c in value for c in "/\\\x00\n") or value.strip() != value:
            raise ValueError("must not contain '/', '\\', NUL, newlines or surrounding spaces")
        return value


class SweBenchRow(Row):
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    base_commit: str = Field(min_length=1)
    test_patch: str = Field(min_length=1)
    hints_text: str = ""
    created_at: Timestamp = ""
    version: Annotated[str, BeforeValidator(_text_or_epoch)] = ""
    environment_setup_commit: str = ""


class SweBenchVerifiedRow(SweBenchRow):
    difficulty: str = ""


class SweGymRow(SweBenchRow):
    pass


class RebenchInstallConfig(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    test_cmd: Commands = Field(min_length=1)
    log_parser: str | None = None
    install: Commands = Field(default_factory=list)
    pre_install: Commands = Field(default_factory=list)


class SweRebenchRow(SweBenchRow):
    install_config: Annotated[RebenchInstallConfig, BeforeValidator(_json_if_text)]
    docker_image: str | None = None
    image_name: str | None = None
    meta: JsonObject | None = None
    license_name: str | None = None
    requirements: str | None = None
    environment: str | None = None


class SweRebenchV2Row(SweBenchRow):
    install_config: Annotated[RebenchInstallConfig, BeforeValidator(_json_if_text)]
    image_name: str = Field(min_length=1)
    language: str = ""
    interface: str = ""
    pr_description: str = ""
    meta: JsonObject | None = None

    @field_validator("install_config")
    @classmethod
    def _parser_named(cls, value: RebenchInstallConfig) -> RebenchInstallConfig:
        if not value.log_parser:
            raise ValueError("log_parser: required in SWE-rebench V2 rows")
        return value


class ScaleSweRow(Row):
    user: str = Field(min_length=1)
    repo: str = Field(min_length=1, pattern=r"^[\w.-]+$")
    workdir: str = Field(pattern=r"^/")
    image_url: str = Field(min_length=1)
    parent_commit: str = ""
    pr_commit: str = ""
    f2p_patch: str | None = None
    f2p_script: str | None = None
    github_url: str = ""
    language: str = ""
    pre_commands: Commands = Field(default_factory=list)


class OrchardInstallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    test_cmd: Commands = Field(min_length=1)
    log_parser: str = Field(min_length=1)


class OrchardRow(SweBenchRow):
    """The bundled tasks' rows: SWE-bench fields plus what an image without the repository
    needs (the rewards service's ``repo_files`` extension) and where the task came from."""

    base_commit: str = ""
    image: str = Field(min_length=1)
    workdir: str = Field(default="/testbed", pattern=r"^/")
    install_config: Annotated[OrchardInstallConfig, BeforeValidator(_json_if_text)]
    pre_commands: Commands = Field(default_factory=list)
    repo_files: dict[str, str] = Field(default_factory=dict)
    source: JsonObject | None = None

    @field_validator("repo_files")
    @classmethod
    def _relative_paths(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            if not path or path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"{path!r} must be a relative path inside workdir")
        return value
