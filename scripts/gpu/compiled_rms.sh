#!/usr/bin/env bash
# Issue 40, compiled mode reaching the kernel: does v0.26.0 diverge with compilation and CUDA
# graphs on (batch-invariance-compiled: no --enforce-eager) once RMSNorm is vLLM's custom op
# again (--compilation-config '{"custom_ops": ["+rms_norm"]}')? Under Inductor vLLM 0.26.0
# defaults custom_ops to "none", so RMSNorm runs as Inductor's code and _C's kernel is never
# called (docs/bench/gpu-2026-12-07b-h100: the compiled recipe saw v0.26.0 clean); with
# +rms_norm, RMSNorm.forward_cuda under VLLM_BATCH_INVARIANT calls _C's fused_add_rms_norm.
#
# Runs ON THE GPU MACHINE from the repo root, once the pinned stack and 0.26.0's extension are
# in place (release_range.sh stack so; knee.sh's payloads): for each of VERSIONS (0.26.0), that
# release's _C_stable_libtorch hard-linked into the pinned site ($DEV/so/V, restored to 0.26.0's
# at exit), LIFETIMES (2) lifetimes at once on GPU 0 (scripts/gpu/knee.py, which sizes them as
# "auto" would), the compiled recipe completed by release_range.sh's recipe step plus the flag.
# Writes $OUT/compiled-rms-V.tsv (knee.py's row: verdicts, co-residency, boot/probe seconds),
# $OUT/compiled-rms-V-lifetimes.ndjson (each lifetime's verdict, message, detail: warm-up apart),
# $OUT/compiled-rms-logs.tgz (server logs), $OUT/compiled-rms.toml (the recipe that ran).
set -euo pipefail
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
LIFETIMES=${LIFETIMES:-2}
VERSIONS=${VERSIONS:-0.26.0}
FLAG=${FLAG:-'{"custom_ops": ["+rms_norm"]}'}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$OUT"
export BISECT_CACHE_DIR=${BISECT_CACHE_DIR:-$DEV/cache}
export PYTHONPATH=$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
RECIPE=batch-invariance-compiled bash "$HERE/release_range.sh" recipe >/dev/null
f=$DEV/batch-invariance-compiled-rms-range.toml
sed "s|^  \"--skip-tokenizer-init\",|&\n  \"--compilation-config\", '$FLAG',|" \
  "$DEV/batch-invariance-compiled-range.toml" >"$f"
python3 -c 'import sys, tomllib; a = tomllib.load(open(sys.argv[1], "rb"))["runtime"]["server_args"]; i = a.index("--compilation-config"); print("[compiled_rms] server_args:", a); assert "--enforce-eager" not in a' "$f"
cp "$f" "$OUT/compiled-rms.toml"
site_so=$DEV/site/vllm/_C_stable_libtorch.abi3.so
trap 'ln -f "$DEV/so/0.26.0/vllm/_C_stable_libtorch.abi3.so" "$site_so"' EXIT
rm -rf "$DEV/compiled-rms" && mkdir -p "$DEV/compiled-rms"
for v in $VERSIONS; do
  [ -f "$DEV/so/$v/vllm/_C_stable_libtorch.abi3.so.ok" ] || { echo "[compiled_rms] $v's extension is not placed"; exit 1; }
  ln -f "$DEV/so/$v/vllm/_C_stable_libtorch.abi3.so" "$site_so"
  echo "[compiled_rms] $v: $(sha256sum "$site_so" | cut -c1-16)... in the pinned site"
  python3 "$HERE/knee.py" "$f" --counts "$LIFETIMES" --out "$DEV/compiled-rms/$v"
  cp "$DEV/compiled-rms/$v/knee.tsv" "$OUT/compiled-rms-$v.tsv"
  cp "$DEV/compiled-rms/$v/lifetimes.jsonl" "$OUT/compiled-rms-$v-lifetimes.ndjson"
done
tar -C "$DEV/compiled-rms" -czf "$OUT/compiled-rms-logs.tgz" --exclude=knee.tsv --exclude=lifetimes.jsonl .
