#!/usr/bin/env bash
# Issue 44 on a lent machine of several GPUs (blocked while none is lent): lifetimes per hour on
# k GPUs against one, in the same session, through --gpus (scripts/gpu/knee.py, PER_GPU lifetimes
# a GPU at once), and the ten-release range's time to answer with k GPUs (release_range.sh with
# GPUS). Runs ON THE GPU MACHINE from the repo root, once release_range.sh's stack, so and model
# steps are done (the payload: knee.sh's). The Ray side: bench/ray_bench.py on that host.
#
#   PER_GPU=4 GPUS=0,1,2,3 bash scripts/gpu/spread.sh
set -euo pipefail
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
PER_GPU=${PER_GPU:-4}
GPUS=${GPUS:-0,1}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
export BISECT_CACHE_DIR=${BISECT_CACHE_DIR:-$DEV/cache}
export PYTHONPATH=$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
bash "$HERE/release_range.sh" model
for gpus in "${GPUS%%,*}" "$GPUS"; do  # one GPU, then all of them, in the same session
  python3 "$HERE/knee.py" "$DEV/batch-invariance-range.toml" --counts "$PER_GPU" --gpu "$gpus" \
    --out "$DEV/spread-${gpus//,/_}"
  cp "$DEV/spread-${gpus//,/_}/knee.tsv" "$OUT/spread-${gpus//,/_}.tsv"
done
python3 - "$OUT/spread-${GPUS%%,*}.tsv" "$OUT/spread-${GPUS//,/_}.tsv" "$GPUS" <<'PY'
import csv, sys
one, many = (next(csv.DictReader(open(p), delimiter="\t")) for p in sys.argv[1:3])
k = len(sys.argv[3].split(","))
ratio = float(many["per_hour"]) / float(one["per_hour"])
print(f"[spread] lifetimes/h: 1 GPU {float(one['per_hour']):.0f}, {k} GPUs "
      f"{float(many['per_hour']):.0f}: {ratio:.2f}x, {ratio / k:.2f} of k (goal >= 0.9)")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
