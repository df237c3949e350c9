#!/usr/bin/env bash
# Issue 39, item 2, on the lent GPU: where the probe's co-residency falls as vLLM servers are
# added to one H100 (the knee "auto" sizing stops at: bisect_tool/runtime/sizing.py,
# AUTO_MOST_PER_GPU). Runs ON THE GPU MACHINE from the repo root, in ONE call once the pinned
# stack is in place on the warm machine.
#
# Payload: the same as scripts/gpu/release_range.sh's first two calls (docs/gpu-runbook.md,
# "Release level"), carried in .devcarry/: vllm026-py.tar.xz, deps-site.tar.xz, fa3-0.26.0.xz
# and vllm-listing.json (call 1: `bash scripts/gpu/release_range.sh stack`), then
# so-0.26.0.xz (call 2: `bash scripts/gpu/release_range.sh so stack verify model`); the servers
# run 0.26.0's own extension, so no other release's payload is needed. Then, in the call that
# measures:
#
#   COUNTS=1,2,4,6,8,10,12 bash scripts/gpu/knee.sh      # ~60-80 s a count, < 600 s in all
#
# Prints one line a count and writes $OUT/knee.tsv (the servers, how many reached the target
# co-residency in every repeat, the least and median peak, boot and probe seconds, the round's
# seconds, lifetimes per hour at that count, MiB a server held), $OUT/knee-lifetimes.ndjson (each
# lifetime's verdict, message and probe detail) and $OUT/knee-logs.tgz.
set -euo pipefail
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
COUNTS=${COUNTS:-1,2,4,6,8,10,12}
GPU=${GPU:-0}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
export BISECT_CACHE_DIR=${BISECT_CACHE_DIR:-$DEV/cache}
export PYTHONPATH=$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
# the recipe release_range.sh completes for this machine ($DEV/batch-invariance-range.toml),
# its weights made once in the cache
bash "$HERE/release_range.sh" model
python3 "$HERE/knee.py" "$DEV/batch-invariance-range.toml" --counts "$COUNTS" --gpu "$GPU" \
  --out "$DEV/knee"
cp "$DEV/knee/knee.tsv" "$OUT/knee.tsv"
cp "$DEV/knee/lifetimes.jsonl" "$OUT/knee-lifetimes.ndjson" 2>/dev/null || true
tar -C "$DEV/knee" -czf "$OUT/knee-logs.tgz" --exclude=knee.tsv --exclude=lifetimes.jsonl .
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
