#!/usr/bin/env bash
# Run the whole suite, in two phases (tests/phases.py, docs/testing.md):
#   1. serial:   the tests marked `serial` (heavy lock, hundreds of sandboxes, latency
#                beside a neighbour, the fake internet), one at a time on a quiet machine;
#   2. parallel: everything else on $ORCHARD_TEST_WORKERS pytest-xdist workers (default 3;
#                0 runs it in this process), whole files per worker.
# Arguments go to both phases (`scripts/run_tests.sh tests/network -x`). The second phase
# runs even if the first failed, so one run reports every failure; the exit code is the
# first non-zero one. pytest's exit code 5 ("no tests collected") is a failure when
# neither phase ran a test: a suite that ran nothing proved nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
workers=${ORCHARD_TEST_WORKERS:-3}
if ! [[ $workers =~ ^[0-9]+$ ]]; then
  echo "ORCHARD_TEST_WORKERS=$workers: expected a number of workers" >&2
  exit 2
fi
parallel_args=()
if [ "$workers" -gt 0 ]; then
  parallel_args=(-n "$workers" --dist loadfile)
fi

phase() {
  local name=$1
  shift
  echo "=== make test: $name phase ===" >&2
  local start=$SECONDS
  # The slowest tests and a JUnit report per phase: what to look at when the run grows.
  ORCHARD_TEST_STRICT=1 ORCHARD_TEST_PHASE=$name .venv/bin/python -m pytest \
    --durations=15 --junitxml="build/test-results/$name.xml" "$@"
  local rc=$?
  echo "=== make test: $name phase: exit $rc after $((SECONDS - start)) s ===" >&2
  return "$rc"
}

phase serial "$@"
serial_rc=$?
phase parallel "${parallel_args[@]}" "$@"
parallel_rc=$?

if [ "$serial_rc" -eq 5 ] && [ "$parallel_rc" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
for rc in "$serial_rc" "$parallel_rc"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
  fi
done
exit 0
