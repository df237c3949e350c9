#!/usr/bin/env bash
# `make check`: the fast tier (no Docker, nothing marked slow) in one process more than the
# machine has cores, each a share of the test files of about equal measured seconds
# (tests/conftest.py, BISECT_TEST_SHARD; tests/check-seconds.json): about 40 % of the tier waits
# (on subprocesses, servers, deadlines), so on 2 cores three processes took 90 s where two took
# 111-126 s and four 96 s. Each process is its own session (setsid): the signal tests' Ctrl-C and
# SIGTERM to a process group stay inside their own pytest (pytest-xdist's workers share one
# and lost their controller to them). Each has its own temp folder in one mktemp -d a run, out
# of the clone, removed at the end: neither sweeps the other's, nor another user's
# /tmp/pytest-of-*. Prints each share's summary (its whole log on failure) and exits non-zero
# if any share failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SHARDS=${SHARDS:-$(($(nproc) + 1))}
logs=.pytest-tmp/logs
mkdir -p "$logs" && rm -f "$logs"/shard*.log
# temp folders outside the clone (tests run the CLI "outside any clone"), this run's own
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bisect-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pids=()
for ((i = 0; i < SHARDS; i++)); do
  BISECT_TEST_SHARD="$i/$SHARDS" setsid "$PY" -m pytest -q -p no:cacheprovider \
    -m "not slow and not docker" --basetemp="$tmp/shard$i" "$@" >"$logs/shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < SHARDS; i++)); do
  if wait "${pids[$i]}"; then
    echo "check: share $((i + 1)) of $SHARDS: $(tail -n 1 "$logs/shard$i.log")"
  else
    status=1
    echo "check: share $((i + 1)) of $SHARDS FAILED ($logs/shard$i.log):"
    cat "$logs/shard$i.log"
  fi
done
exit $status
