#!/usr/bin/env bash
# Issue 40 (item 7) on the lent GPU: the seed's range v0.26.0 .. v0.27.0 with CUDA graphs on
# (batch-invariance-compiled), vLLM's own bs=1 vs bs=N check on both releases
# (batch-invariance-bs1), and the extended op check (fp16 + bf16, the fp8-quantized RMSNorm ops of
# #48997 where registered) on both releases' _C_stable_libtorch. Prepared, not yet run.
#
# Runs ON THE GPU MACHINE from the repo root, several steps a call (docs/gpu-runbook.md, "Issue
# 40"). The stack and the two releases' extensions come as scripts/gpu/release_range.sh takes
# them (its payloads, its $DEV layout), with RELEASES_ONLY="0.26.0 0.27.0", GOOD=0.27.0,
# BAD=0.26.0; every step is idempotent and says what is missing:
#
#   preflight  the card, a C compiler (TorchInductor and Triton build small C modules: no
#              compiler, no compiled mode), torch, triton, and torch.compile of a small function
#              on the GPU, timed -> $OUT/preflight.txt
#   stack      release_range.sh stack model (the pinned 0.26.0 Python side, deps, FA3, the PyPI
#              listing; the random Qwen3-0.6B checkpoint)
#   so         release_range.sh so verify (0.26.0's extension whole, 0.27.0's as a delta from it)
#   ops        the extended op check on each release's extension, with VLLM_BATCH_INVARIANT=1 and
#              without -> $OUT/op-extended-VERSION.json (python -m bisect_tool.probes: torch only)
#   moe-ops    where .devcarry/moe-VERSION.xz is carried (vllm/_moe_C_stable_libtorch.abi3.so),
#              the MoE recipe's op check: the RMSNorm pair of _C and _moe_C's topk_softmax and
#              moe_sum, bf16 -> $OUT/op-moe-VERSION.json
#   bs1        bisect start --releases --good 0.27.0 --bad 0.26.0 --recipe batch-invariance-bs1
#              (tiered: the op check on both, the controls, lifetimes on both sides of the
#              flip), state $DEV/state-tiered-bs1; resumed by the next call past DEADLINE_S
#   compiled   the same with batch-invariance-compiled (no --enforce-eager: compilation and
#              CUDA graphs; the first two requests of each lifetime reported apart), state
#              $DEV/state-tiered-compiled
#   report     each run's journal -> $OUT/journal-tiered-{bs1,compiled}.jsonl; reports (md,
#              json), status, times and lifetime logs -> $OUT/record40.tgz
#
# Env: DEV (/tmp/dev), CARRY (.devcarry), OUT, DEADLINE_S (540, per bisect step), PER_GPU (2),
# PY (python3). The sampler suspects of batch-invariance-compiled are dropped (SUSPECTS=0, as
# release_range.sh does): FlashInfer is not carried, so VLLM_USE_FLASHINFER_SAMPLER=1 would run
# PyTorch's sampler like 0; every lifetime runs with it at 0, as every GPU run did so far.
set -euo pipefail
DEV=${DEV:-/tmp/dev}
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-$DEV/out}
PY=${PY:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DEV CARRY OUT PY
export RELEASES_ONLY="0.26.0 0.27.0" GOOD=0.27.0 BAD=0.26.0
export BISECT_CACHE_DIR=${BISECT_CACHE_DIR:-$DEV/cache}
export PYTHONPATH=$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
mkdir -p "$DEV" "$OUT"

log() { echo "[issue40] $*"; }
so_path() { echo "$DEV/so/$1/vllm/_C_stable_libtorch.abi3.so"; }

step_preflight() {
  {
    nvidia-smi -L || true
    for cc in cc gcc clang; do printf '%s: %s\n' "$cc" "$(command -v "$cc" || echo missing)"; done
    "$PY" - <<'EOF'
import time
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
try:
    import triton
    print("triton", triton.__version__)
except ImportError as exc:
    print("triton missing:", exc)
t = time.time()
try:
    f = torch.compile(lambda x: torch.nn.functional.silu(x) * 2 + 1)
    y = f(torch.ones(64, device="cuda"))
    torch.cuda.synchronize()
    print(f"torch.compile on cuda: ok in {time.time() - t:.1f} s ({float(y[0]):.4f})")
except Exception as exc:  # the compiled runs cannot work: say why, first
    print(f"torch.compile on cuda FAILED in {time.time() - t:.1f} s: {type(exc).__name__}: "
          f"{str(exc).splitlines()[0] if str(exc) else ''}")
EOF
  } 2>&1 | tee "$OUT/preflight.txt"
}

op_check() {  # NAME RECIPE EXTENSION [ALSO...]: both settings of the switch, one JSON
  local name=$1 recipe=$2 ext=$3; shift 3
  local also=() a
  for a in "$@"; do also+=(--also-load "$a"); done
  local dest=$OUT/op-$name.json
  {
    echo '{'
    echo '"batch_invariant":'
    "$PY" -m bisect_tool.probes --recipe "$recipe" --extension "$ext" "${also[@]}" \
      --env VLLM_BATCH_INVARIANT=1 --json || true
    echo ', "default":'
    "$PY" -m bisect_tool.probes --recipe "$recipe" --extension "$ext" "${also[@]}" --json || true
    echo '}'
  } >"$dest"
  "$PY" - "$dest" <<'EOF' || log "op-$name: no result (see the probe's error above)"
import json, sys
d = json.load(open(sys.argv[1]))
for mode, r in d.items():
    print(f"[issue40] {sys.argv[1].rsplit('/', 1)[-1]} {mode}: {r['verdict'].upper()}: "
          f"{r['message']}")
EOF
}

step_ops() {
  local v ext
  for v in 0.26.0 0.27.0; do
    ext=$(so_path "$v")
    if [ -f "$ext.ok" ]; then
      op_check "extended-$v" batch-invariance-op-extended "$ext"
    else
      log "ops: $v's extension is not placed (carry its payload; the so step)"
    fi
  done
}

step_moe_ops() {
  local v moe
  for v in 0.26.0 0.27.0; do
    moe=$DEV/moe/$v/vllm/_moe_C_stable_libtorch.abi3.so
    if [ ! -f "$moe" ] && [ -f "$CARRY/moe-$v.xz" ]; then
      mkdir -p "$(dirname "$moe")"
      "$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2] + ".part", "wb"), 1 << 20)' "$CARRY/moe-$v.xz" "$moe"
      mv -f "$moe.part" "$moe"
    fi
    if [ -f "$moe" ] && [ -f "$(so_path "$v").ok" ]; then
      op_check "moe-$v" batch-invariance-moe "$(so_path "$v")" "$moe"
    else
      log "moe-ops: $v needs .devcarry/moe-$v.xz (vllm/_moe_C_stable_libtorch.abi3.so, xz) and its _C"
    fi
  done
}

step_report() {
  local tag sd rec=$DEV/record40 mode
  rm -rf "$rec" && mkdir -p "$rec"
  for tag in bs1 compiled; do
    mode=tiered-$tag
    sd=$DEV/state-$mode
    [ -f "$sd/journal.jsonl" ] || { log "report: $mode has no journal"; continue; }
    "$PY" -m bisect_tool report --state-dir "$sd" -o "$rec/report-$mode.md" || true
    "$PY" -m bisect_tool report --state-dir "$sd" --format json -o "$rec/report-$mode.json" || true
    "$PY" -m bisect_tool status --json --state-dir "$sd" >"$rec/status-$mode.json" || true
    cp "$sd/journal.jsonl" "$OUT/journal-$mode.jsonl"
    cp "$DEV/times-$mode.tsv" "$rec/times-$mode.tsv" 2>/dev/null || true
    mkdir -p "$rec/logs-$mode" && cp -r "$sd/logs/." "$rec/logs-$mode/" 2>/dev/null || true
  done
  tar -C "$rec" -czf "$OUT/record40.tgz" .
  log "report: $(ls "$OUT" | tr '\n' ' ')"
}

for step in "$@"; do
  t0=$(date +%s)
  case $step in
    preflight) step_preflight ;;
    stack) bash "$HERE/release_range.sh" stack model ;;
    so) bash "$HERE/release_range.sh" so verify ;;
    ops) step_ops ;;
    moe-ops) step_moe_ops ;;
    bs1) RECIPE=batch-invariance-bs1 bash "$HERE/release_range.sh" bisect ;;
    compiled) RECIPE=batch-invariance-compiled bash "$HERE/release_range.sh" bisect ;;
    report) step_report ;;
    *) echo "unknown step $step (preflight, stack, so, ops, moe-ops, bs1, compiled, report)" >&2
       exit 2 ;;
  esac
  log "$step done ($(( $(date +%s) - t0 )) s)"
done
