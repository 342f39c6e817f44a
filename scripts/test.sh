#!/usr/bin/env bash
# The whole suite twice, side by side: once in the default eager mode (strict) and once with fused eager as the
# default mode (every test must pass in every mode). Tests marked pins_mode set the modes they run in themselves, so
# one pass runs them (the fused one; tests/lowering/test_opinfo.py splits its samples over the two passes). A pytest keeps
# about one core busy (XLA:CPU compiles and runs are mostly serial): on the 2-core machine the passes took 23.5 and
# 23.9 min side by side in a fresh clone, 26.0 min for all of .ci/run (2026-12-07, tests/conftest.py's XLA flags).
# Arguments (test paths, pytest options) replace the default `tests` in both runs. Exits non-zero if either pass
# fails; the fused pass's output follows the strict pass's.
# The format and lint checks (scripts/lint.sh) run first: a tree they fail is not tested.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/lint.sh || { echo "lint failed: bash scripts/lint.sh --fix rewrites the files"; exit 1; }
[ $# -gt 0 ] || set -- tests --durations=15  # the slowest tests, for keeping CI within its budget
log=$(mktemp -t torchtpu-fused-pass.XXXXXX)
# a test that hangs ends its pass with its threads' stacks (tests/tools/watchdog.py): they are printed last too
export TORCHTPU_TEST_HANG_REPORT=$(mktemp -t torchtpu-hang-report.XXXXXX)
TORCHTPU_MODE=fused TORCHTPU_TEST_PINNED=run .venv/bin/python -m pytest -p no:cacheprovider "$@" >"$log" 2>&1 &
fused=$!
trap 'kill "$fused" 2>/dev/null; rm -f "$log" "$TORCHTPU_TEST_HANG_REPORT"' EXIT
trap 'exit 130' INT TERM
echo "strict pass (the fused pass runs alongside; its output follows)"
TORCHTPU_MODE=strict TORCHTPU_TEST_PINNED=skip .venv/bin/python -m pytest "$@"
strict_rc=$?
wait "$fused"
fused_rc=$?
echo
echo "=== fused pass (TORCHTPU_MODE=fused) ==="
cat "$log"
[ -s "$TORCHTPU_TEST_HANG_REPORT" ] && { echo; echo "=== hung tests ==="; cat "$TORCHTPU_TEST_HANG_REPORT"; }
echo "strict pass exit $strict_rc, fused pass exit $fused_rc"
[ "$strict_rc" -eq 0 ] && [ "$fused_rc" -eq 0 ]
