#!/usr/bin/env bash
# side_venv.sh DIR MIN_MINOR [SPEC...] : a venv in DIR on the oldest CPython 3.x with x >= MIN_MINOR
# the machine has (PATH, then pyenv's versions; the oldest is the one the tests ran on),
# with SPEC... (if any) pip-installed in it.
# For projects whose package needs a newer Python than the suite's 3.11 (Harbor: 3.12);
# tests/integrations drive them there as subprocesses. Re-run when pyproject.toml changes.
set -euo pipefail
dir=$1 min=$2
shift 2
found=""
for py in $(compgen -c python3. | sort -u) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.*/bin/python3; do
  path=$(command -v "$py" 2>/dev/null) || continue
  minor=$("$path" -c 'import sys; print(sys.version_info[1])' 2>/dev/null) || continue
  if [ "$minor" -ge "$min" ] && { [ -z "$found" ] || [ "$minor" -lt "$found_minor" ]; }; then
    found=$path found_minor=$minor
  fi
done
if [ -z "$found" ]; then
  echo "side_venv.sh: no CPython 3.$min or newer on this machine for $dir" >&2
  exit 1
fi
[ -x "$dir/bin/python" ] || "$found" -m venv "$dir"
if [ "$#" -gt 0 ]; then
  "$dir/bin/python" -m pip install -q "$@"
fi
