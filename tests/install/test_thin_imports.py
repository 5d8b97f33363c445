"""The SDK's import graph stays thin, checked at run time in the dev venv.

The dev venv holds every extra, so a stray ``import structlog`` in the SDK (or in
the orchard.common modules it uses, or in the CLI's client commands) would
succeed silently there and only break a user's ``pip install orchard-env``. A
fresh interpreter imports the SDK and the CLI, builds the CLI's parser and
resolves a client config, then lists what got imported. (The import linter's
"The SDK imports no server package" contract checks the same statically;
test_floor.py runs it where the packages are really absent.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .venvs import SERVER_MODULES

PROBE = """
import json, sys
import orchard, orchard.client, orchard.cli
orchard.cli.build_parser().parse_args(["exec", "sb-x", "--", "true"])
orchard.client.ClientConfig.resolve(endpoint="127.0.0.1:1", api_key="k")
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_sdk_and_cli_import_no_server_package(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    imported = set(json.loads(result.stdout))
    assert "grpc" in imported  # the probe really imported the SDK
    assert not imported & set(SERVER_MODULES), sorted(imported & set(SERVER_MODULES))
