#!/usr/bin/env bash
# Run the whole suite. pytest's exit code 5 ("no tests collected") is a failure
# here: a suite that ran nothing proved nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
ORCHARD_TEST_STRICT=1 .venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
