#!/usr/bin/env bash
# The whole test suite N times in a row with K busy processes beside it (a loaded CI box), each run's summary line
# and wall time appended to a log. Usage: bash infra/suite_under_load.sh [RUNS=3] [HOGS=2] [LOG=runs/suite-under-load.log]
# Extra pytest arguments go in PYTEST_ARGS (e.g. PYTEST_ARGS="tests/env"); run i's whole output goes to LOG's .run<i>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; hogs=${2:-2}; log=${3:-runs/suite-under-load.log}
mkdir -p "$(dirname "$log")"
pids=()
for _ in $(seq "$hogs"); do
  python3 -c "while True: pass" & pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
echo "$(date -u +%FT%TZ) start: $runs runs, $hogs busy processes beside, $(nproc) cores" >> "$log"
failed=0
for i in $(seq "$runs"); do
  t0=$(date +%s)
  full="${log%.log}.run$i.txt"  # the whole output (failures' tracebacks, the slowest tests) beside the log
  # as `make test` runs it: two workers (-n 2)
  .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --durations=30 ${PYTEST_ARGS:-tests} > "$full" 2>&1
  out=$(tail -n 60 "$full")
  summary=$(echo "$out" | grep -E "passed|failed|error" | tail -n 1)
  echo "$(date -u +%FT%TZ) run $i: $summary ($(( $(date +%s) - t0 )) s)" >> "$log"
  echo "$out" | grep -E "^(FAILED|ERROR)" >> "$log"
  echo "$summary" | grep -qE "failed|error" && failed=$((failed + 1))
done
echo "$(date -u +%FT%TZ) done: $failed of $runs runs had failures" >> "$log"
[ "$failed" -eq 0 ]
