"""templates.toml / templates.json: what parses, and the message for what does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orchard.scheduler.settings import CreateLimits
from orchard.scheduler.templates import TemplateConfigError, load_templates

LIMITS = CreateLimits()


def test_toml_with_defaults_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "templates.toml").write_text(
        '[templates.py]\nimage = "debian"\ncpu_millis = 250\nmin = 2\nmax = 8\n'
        'env = { A = "1" }\n\n[templates.bare]\n'
    )
    templates = load_templates(tmp_path, LIMITS)
    assert sorted(templates) == ["bare", "py"]
    py = templates["py"]
    assert (py.image, py.cpu_millis, py.min, py.max, py.env) == ("debian", 250, 2, 8, {"A": "1"})
    assert py.memory_bytes == LIMITS.default_memory_bytes
    bare = templates["bare"]
    assert (bare.image, bare.min, bare.max) == ("", 0, 16)


def test_json_form_and_no_file(tmp_path: Path) -> None:
    assert load_templates(tmp_path, LIMITS) == {}
    (tmp_path / "templates.json").write_text(json.dumps({"templates": {"j": {"max": 3}}}))
    assert load_templates(tmp_path, LIMITS)["j"].max == 3
    (tmp_path / "templates.toml").write_text("")
    with pytest.raises(TemplateConfigError, match="keep one"):
        load_templates(tmp_path, LIMITS)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[templates.Bad]\n", "template name 'Bad'"),
        ("[templates.t]\nmin = 5\nmax = 2\n", "max \\(2\\) is below min \\(5\\)"),
        ("[templates.t]\nflavour = 1\n", "unknown settings flavour"),
        ('[templates.t]\nruntime_class = "kata"\n', "runtime_class 'kata' is not available"),
        ('[templates.t]\nnetwork = "internet"\n', "network 'internet' is not served yet"),
        ("[templates.t]\ncpu_millis = 1\n", "cpu_millis must be between"),
        ('[templates.t]\nmin = "2"\n', "min must be an integer"),
        ('[templates.t]\nenv = { "1X" = "a" }\n', "not a valid variable name"),
        ('[templates.t]\nimage = "../etc"\n', "not a valid image name"),
        ("[pools.t]\n", "unknown top-level keys: pools"),
        ("[templates\n", "cannot parse"),
    ],
)
def test_bad_files_name_the_template_and_field(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "templates.toml").write_text(body)
    with pytest.raises(TemplateConfigError, match=message):
        load_templates(tmp_path, LIMITS)
