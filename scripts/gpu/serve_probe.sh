#!/usr/bin/env bash
# Manual lifetimes of the real experiment (issue 8), without the bisect loop: boot vLLM 0.26.0's
# Python side with one release's _C_stable_libtorch, run `bisect probe --server` once, tear down.
#
# Runs ON THE GPU MACHINE, from the repo root, after setup_stack.sh has put the stack in
# /tmp/dev (site, deps, fa3) and the candidate .so in /tmp/dev/VERSION/. This is what
# vllm-facts.md "Real vLLM on the lent H200" measured by hand; the loop (`bisect start`) must
# reproduce it unattended: see run_e2e.sh.
#
# Usage: scripts/gpu/serve_probe.sh VERSION [LIFETIMES] [MODE]
#   VERSION    0.26.0 or 0.27.0 (which _C_stable_libtorch is swapped in)
#   LIFETIMES  fresh server processes to probe (default 2; ~50-60 s boot + ~10 s probe each)
#   MODE       bi (VLLM_BATCH_INVARIANT=1, default) or default (the positive control: plain
#              vLLM is not batch invariant, so it must diverge or the workload proves nothing)
# Writes $OUT/e2e-VERSION-MODE.json (one entry per lifetime) and $OUT/e2e-VERSION-MODE.log (the
# last lifetime's server log tail). Exit 0 when every lifetime booted and was probed.
#
# Expected (vllm-facts.md): 0.26.0 bi -> DIVERGENT in every lifetime; 0.26.0 default ->
# DIVERGENT; 0.27.0 bi -> CLEAN in every lifetime.
set -uo pipefail

VERSION=${1:?usage: serve_probe.sh VERSION [LIFETIMES] [bi|default]}
LIFETIMES=${2:-2}
MODE=${3:-bi}
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
PORT=${PORT:-8731}
BOOT_TIMEOUT_S=${BOOT_TIMEOUT_S:-300}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=$DEV/qwen3-rand
SO=$DEV/$VERSION/vllm/_C_stable_libtorch.abi3.so
PINNED=$DEV/site/vllm/_C_stable_libtorch.abi3.so
mkdir -p "$OUT" "$DEV/logs"

die() { echo "serve_probe: $*" >&2; exit 3; }
[[ -f $DEV/site/.ok && -f $DEV/deps/.ok ]] || die "stack missing in $DEV; run call 1 (setup_stack.sh)"
[[ -f $SO.ok ]] || die "$SO missing; carry its .devcarry/soNN.xz and run setup_stack.sh"
[[ -f $DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so.ok ]] || die "fa3 missing; carry fa3.xz"
case $MODE in
  bi) MODE_ENV=(VLLM_BATCH_INVARIANT=1) ;;
  default) MODE_ENV=() ;;
  *) die "MODE must be bi or default" ;;
esac

# A random checkpoint at the config's initializer scale, made once per machine (~11 s).
# Not --load-format dummy: dummy weights hide the bug (vllm-facts.md).
if [[ ! -f $MODEL/.ok ]]; then
  t0=$SECONDS
  python3 -m bisect_tool model random --config "$HERE/qwen3-0.6b/config.json" --out "$MODEL" \
    --dtype float16 --seed 0 || die "could not make the random checkpoint"
  touch "$MODEL/.ok"
  echo "checkpoint: $MODEL in $((SECONDS - t0)) s"
fi

# The swap: the candidate's file in place of the pinned one (a hard link; restored at exit).
restore() {
  if [[ -f $DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so.ok ]]; then
    ln -f "$DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so" "$PINNED"
  fi
}
trap restore EXIT
ln -f "$SO" "$PINNED"
echo "swap: $VERSION $(sha256sum "$PINNED" | cut -c1-16) -> $PINNED"

export PYTHONPATH="$DEV/site:$DEV/deps"
export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is not carried (vllm-facts.md)
RESULTS=$OUT/.e2e-$VERSION-$MODE.jsonl
: >"$RESULTS"
failed=0
for i in $(seq 1 "$LIFETIMES"); do
  LOG=$DEV/logs/$VERSION-$MODE-$i.log
  t0=$SECONDS
  # setsid: the server and its engine core child form one process group, killed as a whole.
  env "${MODE_ENV[@]}" PYTHONUNBUFFERED=1 setsid python3 -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name qwen3 --load-format safetensors \
    --enforce-eager --max-model-len 1024 --block-size 16 --dtype float16 \
    --no-enable-prefix-caching --skip-tokenizer-init \
    --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
  pid=$!
  up=0
  while ((SECONDS - t0 < BOOT_TIMEOUT_S)); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    if python3 -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health', timeout=2, trust_env=False).status_code != 200)" 2>/dev/null; then
      up=1; break
    fi
    sleep 2
  done
  boot_s=$((SECONDS - t0))
  if ((up)); then
    # MODE_ENV is not passed: the probe is a client; the server's env is what matters.
    python3 -m bisect_tool.probes --server "http://127.0.0.1:$PORT" --recipe batch-invariance \
      --json >"$OUT/.probe.json" 2>"$OUT/.probe.err"
    rc=$?
  else
    rc=99
    echo '{"verdict": "boot-failed"}' >"$OUT/.probe.json"
    failed=1
  fi
  kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  python3 - "$OUT/.probe.json" "$RESULTS" "$i" "$rc" "$boot_s" "$((SECONDS - t0))" <<'EOF'
import json, sys
probe, results, i, rc, boot_s, total_s = sys.argv[1:]
try:
    d = json.load(open(probe))
except ValueError:
    d = {"verdict": "no-result"}
entry = {"lifetime": int(i), "exit": int(rc), "boot_s": int(boot_s), "total_s": int(total_s), **d}
open(results, "a").write(json.dumps(entry) + "\n")
print(f"lifetime {i}: exit {rc}, boot {boot_s} s, total {total_s} s: "
      f"{str(d.get('verdict')).upper()}: {d.get('message', '')}")
EOF
  [[ $rc -le 2 ]] || failed=1
done
python3 -c "import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])], indent=1))" \
  "$RESULTS" >"$OUT/e2e-$VERSION-$MODE.json"
tail -c 200000 "$LOG" >"$OUT/e2e-$VERSION-$MODE.log"
rm -f "$RESULTS" "$OUT/.probe.json" "$OUT/.probe.err"
exit $failed
