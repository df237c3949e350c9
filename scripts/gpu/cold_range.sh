#!/usr/bin/env bash
# Issue 39 (items 5-6) on the lent GPU: the tiered release run of release_range.sh again, from an
# empty artifact cache, its listing and swap sets fetched over HTTP from a PyPI on loopback
# (scripts/gpu/release_host.py) through one link of a stated bandwidth. The GPU machine reaches
# no index and cannot hold the ten 250-315 MB wheels: the index lists what PyPI lists (the saved
# listing) and serves the ten x86_64 wheels as release_host.py's LAYOUT makes them from the
# carried extensions and each wheel's carried head (end records, central directory, local
# headers): `sparse` is byte for byte PyPI's wherever a member fetch reads (the member fetch
# this needs: a release source that fetches the swap-set members by range); `padded` is a real
# zip of the real size for a source that downloads whole wheels, listed with its own sha256.
#
# Runs ON THE GPU MACHINE from the repo root, after release_range.sh's stack, so and model
# steps (the extensions placed, the recipe written, the checkpoint made). Bounded by DEADLINE_S;
# a second call resumes the run (the host is started again, the cold cache kept).
#
#   build    wheel-heads.tar.xz -> $DEV/heads; the index's files -> $DEV/host-LAYOUT
#   run      the host on 127.0.0.1 (killed at exit); `bisect start --releases` (or resume) with
#            BISECT_CACHE_DIR=$DEV/cache-cold-http (emptied at the start; the random checkpoint,
#            no artifact, linked in from the warm cache) and PIP_INDEX_URL the loopback index;
#            state $DEV/state-cold-http, seconds in $DEV/times-cold-http.tsv, requests in $LOGS/cold-host.tsv
#   report   journal -> $OUT/journal-cold.jsonl; report, status, times, logs -> $OUT/record-cold.tgz
#
# Env: DEV (/tmp/dev), CARRY (.devcarry), OUT, DEADLINE_S (540), GOOD (0.28.0), BAD (0.22.0),
# LAYOUT (auto: sparse where ReleaseSource fetches members, else padded), RATE_MB_S (50: what `pip download` of the vLLM wheels from PyPI got on the
# preparing machine, ~50-65 MB/s; 0: unthrottled), RECIPE_FILE (the one release_range.sh wrote).
set -euo pipefail
DEV=${DEV:-/tmp/dev}
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-$DEV/out}
DEADLINE_S=${DEADLINE_S:-540}
GOOD=${GOOD:-0.28.0}
BAD=${BAD:-0.22.0}
LAYOUT=${LAYOUT:-auto}
RATE_MB_S=${RATE_MB_S:-50}
PY=${PY:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RECIPE_FILE=${RECIPE_FILE:-$DEV/batch-invariance-range.toml}
if [ "$LAYOUT" = auto ]; then
  # sparse where the release source fetches the swap-set members by range (issue 39, item 5);
  # padded where it still downloads whole wheels and checks their sha256
  LAYOUT=$(PYTHONPATH=$PWD "$PY" -c 'import inspect
from bisect_tool.artifacts.release_source import ReleaseSource
print("sparse" if "fetch_members" in inspect.getsource(ReleaseSource) else "padded")')
fi
HOST=$DEV/host-$LAYOUT
# Names of their own: branch slots' `release_range.sh cold` (files from local folders, no fetch)
# keeps $DEV/state-cold; both bring back journal-cold.jsonl, what bench/gpu_record.py reads
COLD=$DEV/cache-cold-http
SD=$DEV/state-cold-http
# A call brings back 8 files: the logs go into record-cold.tgz, not $OUT
LOGS=$DEV/cold-http-logs
mkdir -p "$DEV" "$OUT" "$LOGS"
export PYTHONPATH=${PYTHONPATH_PRE:+$PYTHONPATH_PRE:}$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0

log() { echo "[cold_range] $*"; }

step_build() {
  if [ ! -f "$DEV/heads/.ok" ]; then
    [ -f "$CARRY/wheel-heads.tar.xz" ] || { log "build: heads MISSING (carry .devcarry/wheel-heads.tar.xz)"; return 1; }
    rm -rf "$DEV/heads" && mkdir -p "$DEV/heads"
    if command -v xz >/dev/null; then xz -dc -T0 "$CARRY/wheel-heads.tar.xz" | tar -C "$DEV/heads" -xf -
    else "$PY" -c 'import tarfile,sys; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="tar")' "$CARRY/wheel-heads.tar.xz" "$DEV/heads"
    fi
    touch "$DEV/heads/.ok"
  fi
  local listing=$DEV/cache/index/vllm.json
  [ -f "$listing" ] || listing=$CARRY/vllm-listing.json
  [ -f "$listing" ] || { log "build: no saved listing (release_range.sh stack, with vllm-listing.json)"; return 1; }
  if [ ! -f "$HOST/index.json" ]; then
    rm -rf "$HOST"
    "$PY" "$HERE/release_host.py" build --heads "$DEV/heads" --so-dir "$DEV/so" \
      --listing "$listing" --out "$HOST" --layout "$LAYOUT"
  fi
  log "build: $HOST ($(ls "$HOST/files" | wc -l) wheels, layout $LAYOUT)"
}

step_run() {
  [ -f "$HOST/index.json" ] || { log "run: no index built (the build step)"; return 1; }
  [ -f "$RECIPE_FILE" ] || { log "run: $RECIPE_FILE missing (release_range.sh model writes it)"; return 1; }
  if [ ! -f "$SD/journal.jsonl" ]; then
    # Empty: no listing, no manifest, no blob. The checkpoint is no artifact (the model step
    # made it once for every run): linked, so this run does not time its making.
    rm -rf "$COLD" && mkdir -p "$COLD"
    [ -d "$DEV/cache/models" ] && cp -al "$DEV/cache/models" "$COLD/models"
  else
    local state
    state=$(BISECT_CACHE_DIR=$COLD "$PY" -m bisect_tool status --json --state-dir "$SD" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    if [ "$state" != running ]; then log "run: already ended ($state)"; return 0; fi
  fi
  rm -f "$HOST/url"
  "$PY" "$HERE/release_host.py" serve --dir "$HOST" --rate-mb-s "$RATE_MB_S" \
    --port-file "$HOST/url" --log "$LOGS/cold-host.tsv" >>"$LOGS/cold-host.log" 2>&1 &
  local host_pid=$!
  # shellcheck disable=SC2064  # the pid now
  trap "kill $host_pid 2>/dev/null || true" EXIT
  local i
  for i in $(seq 100); do [ -f "$HOST/url" ] && break; sleep 0.1; done
  [ -f "$HOST/url" ] || { log "run: the host did not start ($(tail -3 "$LOGS/cold-host.log"))"; return 1; }
  local url rc t0
  url=$(cat "$HOST/url")
  log "run: index $url/simple, $RATE_MB_S MB/s, cache $COLD ($(du -sh "$COLD" | cut -f1) of checkpoint)"
  t0=$(date +%s)
  set +e
  if [ -f "$SD/journal.jsonl" ]; then
    BISECT_CACHE_DIR=$COLD PIP_INDEX_URL=$url/simple timeout --signal=TERM --kill-after=60 "$DEADLINE_S" \
      "$PY" -m bisect_tool resume --state-dir "$SD" -v 2>&1 | tee -a "$LOGS/bisect-cold.log"
  else
    BISECT_CACHE_DIR=$COLD PIP_INDEX_URL=$url/simple timeout --signal=TERM --kill-after=60 "$DEADLINE_S" \
      "$PY" -m bisect_tool start --releases --good "$GOOD" --bad "$BAD" --recipe "$RECIPE_FILE" \
      --state-dir "$SD" -v 2>&1 | tee "$LOGS/bisect-cold.log"
  fi
  rc=${PIPESTATUS[0]}
  set -e
  echo -e "$(date -u +%FT%TZ)\t$(( $(date +%s) - t0 ))\t$rc" >>"$DEV/times-cold-http.tsv"
  kill "$host_pid" 2>/dev/null || true
  wait "$host_pid" 2>/dev/null || true
  trap - EXIT
  BISECT_CACHE_DIR=$COLD "$PY" -m bisect_tool status --state-dir "$SD" || true
  log "run: exit $rc$([ "$rc" = 124 ] && echo ' (deadline: the next call resumes it)'); $(awk -F'\t' '{s += $2; n++} END {printf "%d s over %d call(s)", s, n}' "$DEV/times-cold-http.tsv"); $(awk -F'\t' '$4 ~ /^\/files\// {b += $7; n++} END {printf "%d requests, %d bytes of wheels", n, b}' "$LOGS/cold-host.tsv")"
}

step_report() {
  local rec=$DEV/record-cold-http
  [ -f "$SD/journal.jsonl" ] || { log "report: no journal"; return 0; }
  rm -rf "$rec" && mkdir -p "$rec"
  export BISECT_CACHE_DIR=$COLD
  "$PY" -m bisect_tool report --state-dir "$SD" -o "$rec/report-cold.md" || true
  "$PY" -m bisect_tool report --state-dir "$SD" --format json -o "$rec/report-cold.json" || true
  "$PY" -m bisect_tool status --json --state-dir "$SD" >"$rec/status-cold.json" || true
  cp "$SD/journal.jsonl" "$OUT/journal-cold.jsonl"
  cp "$LOGS"/* "$rec/" 2>/dev/null || true
  cp "$DEV/times-cold-http.tsv" "$rec/times-cold.tsv"  # the name bench/gpu_record.py reads
  cp "$HOST/index.json" "$rec/host-index.json" 2>/dev/null || true
  mkdir -p "$rec/logs-cold" && cp -r "$SD/logs/." "$rec/logs-cold/" 2>/dev/null || true
  tar -C "$rec" -czf "$OUT/record-cold.tgz" .
  log "report: $(du -b "$OUT/record-cold.tgz" | cut -f1) bytes"
}

for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build) step_build ;;
    run) step_run ;;
    report) step_report ;;
    *) echo "unknown step $step (build, run, report)" >&2; exit 2 ;;
  esac
  log "$step done ($(( $(date +%s) - t0 )) s)"
done
