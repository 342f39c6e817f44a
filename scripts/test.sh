#!/usr/bin/env bash
# The whole suite twice, side by side: once in the default eager mode (strict) and once with fused eager as the
# default mode (every test must pass in every mode; tests marked pins_mode run the modes they need themselves and
# only in the strict pass). One pytest per pass: each keeps about one core busy (its XLA:CPU compiles and runs are
# mostly serial), so on this 2-core machine the two passes together take about as long as one alone.
# Arguments (test paths, pytest options) replace the default `tests` in both runs. Exits non-zero if either pass fails; the fused pass's output follows the strict's.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- tests
log=$(mktemp -t torchtpu-fused-pass.XXXXXX)
TORCHTPU_MODE=fused .venv/bin/python -m pytest -p no:cacheprovider "$@" >"$log" 2>&1 &
fused=$!
trap 'kill "$fused" 2>/dev/null; rm -f "$log"' EXIT
trap 'exit 130' INT TERM
echo "strict pass (the fused pass runs alongside; its output follows)"
TORCHTPU_MODE=strict .venv/bin/python -m pytest "$@"
strict_rc=$?
wait "$fused"
fused_rc=$?
echo
echo "=== fused pass (TORCHTPU_MODE=fused) ==="
cat "$log"
echo "strict pass exit $strict_rc, fused pass exit $fused_rc"
[ "$strict_rc" -eq 0 ] && [ "$fused_rc" -eq 0 ]
