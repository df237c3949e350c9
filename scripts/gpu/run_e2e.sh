#!/usr/bin/env bash
# PLACEHOLDER: the unattended loop on the GPU machine (issue 8). NOT READY: see
# scripts/gpu/TODO-run_e2e.md for what is unverified. It refuses to run until
# BISECT_E2E_READY=1 is set, so nobody mistakes it for a checked run. The same experiment by hand,
# which does work today, is scripts/gpu/serve_probe.sh.
#
# Runs ON THE GPU MACHINE, from the repo root, after setup_stack.sh (stack in /tmp/dev) and with
# both releases' _C_stable_libtorch unpacked (/tmp/dev/0.26.0, /tmp/dev/0.27.0).
set -euo pipefail
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ ${BISECT_E2E_READY:-0} != 1 ]]; then
  echo "run_e2e.sh: not ready; read $HERE/TODO-run_e2e.md (set BISECT_E2E_READY=1 once fixed)" >&2
  exit 2
fi
export PYTHONPATH="$DEV/site:$DEV/deps"   # bisect's own deps (gitpython, tenacity, docker) ride in deps.tar
export VLLM_USE_FLASHINFER_SAMPLER=0
REPO=${VLLM_REPO:?TODO: a vLLM git repo with tags v0.26.0 and v0.27.0 on the device}
GOOD_SHA=${GOOD_SHA:?TODO: full SHA of v0.27.0}
BAD_SHA=${BAD_SHA:?TODO: full SHA of v0.26.0}

# Artifacts cannot be downloaded there (no internet): import the two ends into the cache.
python3 -m bisect_tool artifacts import --commit "$BAD_SHA" --repo "$REPO" \
  "$DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so" --cache-dir "$DEV/cache"
python3 -m bisect_tool artifacts import --commit "$GOOD_SHA" --repo "$REPO" \
  "$DEV/0.27.0/vllm/_C_stable_libtorch.abi3.so" --cache-dir "$DEV/cache"

# TODO(lead): flags to be fixed once the loop exists on the device (cache dir flag, model path).
BISECT_CACHE_DIR=$DEV/cache python3 -m bisect_tool start --good v0.27.0 --bad v0.26.0 \
  --recipe batch-invariance --backend local --python python3 --pinned-dir "$DEV/site" \
  --model "$DEV/qwen3-rand" --repo "$REPO" --state-dir "$DEV/state" --max-evaluations 8 \
  2>&1 | tee "$OUT/e2e-bisect.log"
python3 -m bisect_tool report --repo "$REPO" --state-dir "$DEV/state" >"$OUT/e2e-report.md" || true
