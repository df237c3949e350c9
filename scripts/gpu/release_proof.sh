#!/usr/bin/env bash
# Issues 16 and 18 on the lent H200: the release-level, tiered bisect over the real PyPI releases
# 0.24.0, 0.25.0, 0.25.1, 0.26.0, 0.27.0, and `bisect locate` on 0.26.0 / 0.27.0.
#
# Runs ON THE GPU MACHINE from the repo root, one step per call (docs/gpu-runbook.md, "Release
# level"): each call carries at most 64 MiB, so the payloads arrive over several chained calls
# and /tmp/dev lives only while the machine stays warm. Every step is idempotent and says what
# is missing.
#
#   stack            vllm026-py + deps-site + fa3-0.26.0 -> /tmp/dev/site (the pinned Python
#                    side: 0.26.0's), /tmp/dev/deps; the saved PyPI listing of vllm -> the cache
#   so V [V...]      .devcarry/so-V.xz -> /tmp/dev/V/vllm/_C_stable_libtorch.abi3.so (sha256
#                    checked) and `bisect artifacts import --release V` (0.25.0 also as 0.25.1:
#                    the two wheels carry the same file)
#   site27           vllm027-py + fa3-0.27.0 -> /tmp/dev/site27 (0.27.0's Python side), with its
#                    own _C_stable_libtorch
#   bisect           `bisect start --releases --good 0.27.0 --bad 0.24.0` (tiered: the op check
#                    narrows, server lifetimes confirm), or `bisect resume` when one is under way;
#                    bounded by DEADLINE_S, resumable in the next call
#   locate           `bisect locate --releases --good 0.27.0 --bad 0.26.0` with the two sites
#   report           report.md/.json, journals and logs to $OUT
set -euo pipefail
DEV=${DEV:-/tmp/dev}
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-$DEV/out}
DEADLINE_S=${DEADLINE_S:-540}
mkdir -p "$DEV" "$OUT"
export BISECT_CACHE_DIR=$DEV/cache
export PYTHONPATH=$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
# No index is reachable from here: the release listing comes from the cache (saved from PyPI).
export PIP_INDEX_URL=https://pypi.org/simple

# sha256 of each release's vllm/_C_stable_libtorch.abi3.so (`bisect artifacts extract` of the
# PyPI wheels here; 0.25.1's equals 0.25.0's), and of the 0.27.0 Python side's pieces
declare -A SHA=(
  [0.24.0]=686ece5394839c1eb214ba91fdf0219e47fab4ccce0a69a10d3fba39db9a47fb
  [0.25.0]=186f5c6dde249b76984340b2d44d6f721f9aec7b88f5b976c01c019e76c61b10
  [0.26.0]=87a4360c79ec9278a4f359957755f370141bdb272a73f314bd43ce4e4279c6b4
  [0.27.0]=d60a4547504db80b5307bfa4d146c5e3278f95add4ccf585b7ed9570b41741f5
  # the tar's hash depends on how it was made: PY27_SHA gives the one of a remade payload
  [py27]=${PY27_SHA:-89c43a5b51529b40e17e04e2b961f7116bd4b9eeec37e24f5eecf636bbc46a62}
  [fa3-0.27.0]=2f5c2a8217f81f2390c468ed6072e40fbeb45fab4cffc83bb48adfcc29bff53b
)
# Each extension comes whole (.xz) or as a zstd delta from another release's (.from-B.zst):
# 0.27.0's is 5.7 MB from 0.26.0's, 0.25.0's 3.3 MB, 0.24.0's 33.6 MB from 0.25.0's.
so_path() { echo "$DEV/$1/vllm/_C_stable_libtorch.abi3.so"; }
log() { echo "[release_proof] $*"; }

unxz_to() {  # SRC DEST (atomic)
  mkdir -p "$(dirname "$2")"
  if command -v xz >/dev/null; then xz -dc -T0 "$1" >"$2.part"
  else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 20)' "$1" "$2.part"
  fi
  mv -f "$2.part" "$2"
}
untar_xz() {  # SRC DIR
  mkdir -p "$2"
  if command -v xz >/dev/null; then xz -dc -T0 "$1" | tar -C "$2" -xf -
  else python3 -c 'import tarfile,sys; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$1" "$2"
  fi
}
recipe() {  # the bundled recipe completed for this machine; $1: extra [runtime] lines
  local f=$DEV/batch-invariance-h200${1:+-gated}.toml
  # one lifetime at a time: two vLLM servers profiling one GPU at once each count the other's
  # memory as their own ("Available KV cache memory: -0.67 GiB", seen here with 0.4 each)
  sed -e "s|^backend = \"local\"|backend = \"local\"\npinned_package_dir = \"$DEV/site\"\npython = \"python3\"\ngpus = [\"0\"]${1:+\\n$1}|" \
      -e "s|^VLLM_BATCH_INVARIANT = \"1\"|VLLM_BATCH_INVARIANT = \"1\"\nVLLM_USE_FLASHINFER_SAMPLER = \"0\"|" \
      -e "s|^weights = \"random:models/qwen3-0.6b\"|weights = \"random:$PWD/bisect_tool/recipes/models/qwen3-0.6b\"|" \
      bisect_tool/recipes/batch-invariance.toml > "$f"
  echo "$f"
}

step_stack() {
  if [ ! -f "$DEV/site/.ok" ]; then
    # the tar is kept: 0.27.0's Python side arrives as a delta from it
    unxz_to "$CARRY/vllm026-py.tar.xz" "$DEV/py26.tar"
    mkdir -p "$DEV/site" && tar -C "$DEV/site" -xf "$DEV/py26.tar" && touch "$DEV/site/.ok"
    log "site: 0.26.0's Python side"
  fi
  [ -f "$DEV/deps/.ok" ] || { untar_xz "$CARRY/deps-site.tar.xz" "$DEV/deps"; touch "$DEV/deps/.ok"; log "deps: $(ls "$DEV/deps" | wc -l) entries"; }
  [ -f "$DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" ] || { unxz_to "$CARRY/fa3-0.26.0.xz" "$DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"; log "fa3 0.26.0"; }
  mkdir -p "$BISECT_CACHE_DIR/index"
  [ -f "$CARRY/vllm-listing.json" ] && cp "$CARRY/vllm-listing.json" "$BISECT_CACHE_DIR/index/vllm.json"
  python3 -c 'import vllm, fastapi, uvicorn, openai, msgspec, zmq, xgrammar; print("vllm", vllm.__version__, "imports")'
}

step_so() {
  for v in "$@"; do
    local dest; dest=$(so_path "$v")
    if [ ! -f "$dest" ]; then
      mkdir -p "$(dirname "$dest")"
      if [ -f "$CARRY/so-$v.xz" ]; then unxz_to "$CARRY/so-$v.xz" "$dest"
      else
        local patch; patch=$(ls "$CARRY"/so-"$v".from-*.zst)
        local base=${patch##*.from-}; base=${base%.zst}
        python3 scripts/gpu/zpatch.py "$(so_path "$base")" "$patch" "$dest" "${SHA[$v]}"
      fi
    fi
    echo "${SHA[$v]}  $dest" | sha256sum -c --quiet
    if [ "$v" = 0.26.0 ] && [ ! -f "$DEV/site/vllm/_C_stable_libtorch.abi3.so" ]; then
      ln "$dest" "$DEV/site/vllm/_C_stable_libtorch.abi3.so"  # the pinned stack's own
    fi
    python3 -m bisect_tool artifacts import --recipe batch-invariance --release "$v" "$dest"
    if [ "$v" = 0.25.0 ]; then
      python3 -m bisect_tool artifacts import --recipe batch-invariance --release 0.25.1 "$dest"
    fi
  done
  python3 -m bisect_tool artifacts ls
}

step_site27() {
  if [ ! -f "$DEV/site27/.ok" ]; then
    python3 scripts/gpu/zpatch.py "$DEV/py26.tar" "$CARRY/py27.tar.from-py26.zst" "$DEV/py27.tar" "${SHA[py27]}"
    mkdir -p "$DEV/site27" && tar -C "$DEV/site27" -xf "$DEV/py27.tar" && touch "$DEV/site27/.ok"
  fi
  if [ "${FA3_PINNED:-0}" = 1 ]; then
    # 0.27.0's own FA3 is built against torch 2.13 and does not load on this machine's 2.11;
    # 0.26.0's does, and its Python interface to FA3 is the same in both releases (they differ
    # only in the FA4/cute paths). FA3 is then one file held fixed in every cell, like torch.
    [ -f "$DEV/site27/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" ] || ln \
      "$DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" "$DEV/site27/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
  else
    [ -f "$DEV/site27/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" ] || python3 scripts/gpu/zpatch.py \
      "$DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" "$CARRY/fa3-0.27.0.from-0.26.0.zst" \
      "$DEV/site27/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" "${SHA[fa3-0.27.0]}"
  fi
  [ -f "$DEV/site27/vllm/_C_stable_libtorch.abi3.so" ] || ln "$DEV/0.27.0/vllm/_C_stable_libtorch.abi3.so" "$DEV/site27/vllm/_C_stable_libtorch.abi3.so"
  log "site27: 0.27.0's Python side"
}

step_bisect() {
  local r; r=$(recipe)
  set +e
  if [ -f "$DEV/state/journal.jsonl" ]; then
    timeout --signal=TERM "$DEADLINE_S" python3 -m bisect_tool resume --state-dir "$DEV/state" -v 2>&1 | tee -a "$OUT/bisect.log"
  else
    timeout --signal=TERM "$DEADLINE_S" python3 -m bisect_tool start --releases --good 0.27.0 --bad 0.24.0 \
      --recipe "$r" --state-dir "$DEV/state" -v 2>&1 | tee "$OUT/bisect.log"
  fi
  local rc=${PIPESTATUS[0]}
  set -e
  python3 -m bisect_tool status --state-dir "$DEV/state" || true
  return 0
}

step_locate() {
  # 0.27.0's Python registers ops 0.26.0's _C lacks (Kimi, DeepSeek V4, KDA kernels) or holds
  # in an older form (dsv3_fused_a_gemm): the gate compares the ops Qwen3's eager path calls
  # only; one it calls and the gate skipped would fail its lifetime, UNTESTABLE, not pass.
  local r; r=$(recipe 'gate_ops = ["rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding", "reshape_and_cache_flash"]')
  set +e
  # a second call with the same arguments resumes a locate the deadline cut
  timeout --signal=TERM "$DEADLINE_S" python3 -m bisect_tool locate --releases --good 0.27.0 \
    --bad 0.26.0 --recipe "$r" --good-python "$DEV/site27" --bad-python "$DEV/site" \
    --state-dir "$DEV/locate" --lifetimes-per-cell "${CELL_LIFETIMES:-4}" ${LOCATE_FLAGS:-} --json -v \
    > "$OUT/locate.json" 2> >(tee -a "$OUT/locate.log" >&2)
  set -e
  cat "$OUT/locate.json"
  return 0
}

step_report() {
  python3 -m bisect_tool report --state-dir "$DEV/state" -o "$OUT/report.md" || true
  python3 -m bisect_tool report --state-dir "$DEV/state" --format json -o "$OUT/report.json" || true
  cp "$DEV/state/journal.jsonl" "$OUT/journal.jsonl" 2>/dev/null || true
  cp "$DEV/locate/locate.jsonl" "$OUT/locate.jsonl" 2>/dev/null || true
  tar -C "$DEV" -czf "$OUT/logs.tgz" state/logs locate/logs 2>/dev/null || true
}

for step in "$@"; do
  case $step in
    stack) step_stack ;;
    so:*) IFS=, read -ra vs <<<"${step#so:}"; step_so "${vs[@]}" ;;
    site27) step_site27 ;;
    bisect) step_bisect ;;
    locate) step_locate ;;
    report) step_report ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
