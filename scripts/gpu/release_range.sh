#!/usr/bin/env bash
# Issue 31 (items 4-5) on the lent GPU: `bisect start --releases --good 0.27.0 --bad 0.22.0
# --recipe batch-invariance` over every vLLM release on PyPI from 0.22.0 to 0.28.0 (0.22.0,
# 0.22.1, 0.23.0, 0.24.0, 0.25.0, 0.25.1, 0.26.0, 0.27.0, 0.27.1, 0.28.0; none yanked or
# pre-release) with cached artifacts, tiered and with --no-narrow, timed.
#
# Runs ON THE GPU MACHINE from the repo root, several steps per call (docs/gpu-runbook.md,
# "Release level"): a call carries at most 64 MiB, so the payloads arrive over chained calls and
# /tmp/dev lives only while the machine stays warm. Every step is idempotent, says what is
# missing, and prints one line `[release_range] STEP: ... (N s)`.
#
#   stack     vllm026-py + deps-site + fa3-0.26.0 -> $DEV/site (the pinned Python side:
#             0.26.0's wheel minus its GPU kernels), $DEV/deps; the tool's own dependencies the
#             image lacks or holds too old (their wheels ride in deps-site under .tool-wheels/);
#             the saved PyPI listing of vllm -> the cache (the machine lists releases offline)
#   so        every release's vllm/_C_stable_libtorch.abi3.so whose payload is here: whole
#             (.devcarry/so-V.xz) or a zstd delta from another release's (so-V.from-B.zst,
#             applied by zpatch.py once B is placed; one that came first waits in
#             $DEV/pending), sha256 checked, into $DEV/so/V; then
#             `bisect artifacts import --release V` for each release, the byte-identical ones
#             (0.22.1 = 0.22.0, 0.25.1 = 0.25.0) from the same file. Says what is still missing.
#             Also vllm/_moe_C_stable_libtorch.abi3.so (so-moe-V.xz, so-moe-V.from-moe-B.zst)
#             into $DEV/moe/V, for issue 40's MoE op check (scripts/gpu/issue40.sh)
#   verify    the pinned server module imports with 0.26.0's extension in place
#   model     the random Qwen3-0.6B checkpoint the recipe asks for, made once in the cache, so
#             neither timed run pays for it
#   bisect    tiered (the op check narrows, lifetimes confirm), state $DEV/state-tiered
#   again     the same tiered run once more on the same (now warm) machine, state
#             $DEV/state-tiered-again: the first run's first boots pay the machine's cold start
#             (first imports 29 s against 0 s warm, model warm-up 22.9 s against 2.1 s: the
#             2026-12-07c record), which a machine that has run vLLM before does not
#   nonarrow  --no-narrow (lifetimes only), state $DEV/state-nonarrow
#   cold      the default run from an emptied cache (issue 39, item 5: "artifacts carried in,
#             the cache emptied"): $DEV/cache-cold holds only the listing, and each release's
#             files come from its carried folder ($DEV/so/V, [artifacts] local_paths), state
#             $DEV/state-cold
#             Each: `bisect start`, or `bisect resume` when its journal exists; bounded by
#             DEADLINE_S (SIGTERM: the run journals and stops), resumed by the next call. The
#             seconds of every call are appended to $DEV/times-MODE.tsv and summed.
#   report    the journals of both runs -> $OUT/journal-MODE.jsonl; their reports (md, json),
#             status, timings and logs -> $OUT/record.tgz
#   recipe    only writes (and checks) the recipe the runs use: $DEV/batch-invariance-range.toml
#
# Env: DEV (/tmp/dev), CARRY (.devcarry), OUT, DEADLINE_S (540), GOOD (0.28.0), BAD (0.22.0),
# GATE_OPS (unset: the full gate; a space-separated op list limits it, as release_proof's locate),
# RELEASES_ONLY (a space-separated subset of the ten, for a shorter range), PER_GPU ("auto", the
# recipe's default: as many lifetimes on the GPU as its free memory holds, at most 6 (8 servers with the
# controls') until the probe's co-residency says otherwise, each server told its KV cache size, the controls on slots
# of their own: bisect_tool/runtime/sizing.py; a number N > 1: N, each told 3 GiB, the seed's
# 27,744 tokens, so it skips vLLM's free-memory profile, and the controls' server on a slot of
# its own: [runtime] controls_own_slot; 1: one lifetime at a time),
# RECIPE (batch-invariance: the bundled recipe the runs use, completed for this machine; another
# one's runs keep their own state, times and journals, named with its suffix, e.g.
# state-tiered-compiled for batch-invariance-compiled: scripts/gpu/issue40.sh), SUSPECTS (0: its
# [probe.suspects] are dropped; FlashInfer is not carried, so VLLM_USE_FLASHINFER_SAMPLER=1 would
# run the same PyTorch sampler as 0, at two lifetimes a value).
set -euo pipefail
DEV=${DEV:-/tmp/dev}
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-$DEV/out}
DEADLINE_S=${DEADLINE_S:-540}
GOOD=${GOOD:-0.28.0}
PER_GPU=${PER_GPU:-auto}
GPUS=${GPUS:-0}  # the GPUs lifetimes spread over (issue 44: "0,1,2,3")
BAD=${BAD:-0.22.0}
PY=${PY:-python3}
RECIPE=${RECIPE:-batch-invariance}
TAG=${RECIPE#batch-invariance}  # "" for the seed's recipe, "-compiled" for its compiled twin
SUSPECTS=${SUSPECTS:-0}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$DEV" "$OUT"
export BISECT_CACHE_DIR=${BISECT_CACHE_DIR:-$DEV/cache}
# PYTHONPATH_PRE: only for a dry run off the device (an interpreter of another Python version
# needs its own zstandard ahead of the cp312 one in $DEV/deps)
export PYTHONPATH=${PYTHONPATH_PRE:+$PYTHONPATH_PRE:}$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
# No index is reachable from there: the release listing comes from the cache (saved from PyPI).
export PIP_INDEX_URL=https://pypi.org/simple

# Every release in the range -> the release whose file it carries (byte-identical swap sets).
RELEASES=(0.22.0 0.22.1 0.23.0 0.24.0 0.25.0 0.25.1 0.26.0 0.27.0 0.27.1 0.28.0)
declare -A FILE_OF=([0.22.1]=0.22.0 [0.25.1]=0.25.0)
# RELEASES_ONLY="0.25.0 ... 0.28.0": a shorter range (fewer payloads, fewer calls), with GOOD/BAD
if [ -n "${RELEASES_ONLY:-}" ]; then read -ra RELEASES <<<"$RELEASES_ONLY"; fi
# sha256 of each distinct vllm/_C_stable_libtorch.abi3.so (`bisect artifacts extract` of the
# PyPI wheels). 0.23.0: the build-tagged wheel vllm-0.23.0-2-..., the one pip and the tool pick
# (the untagged 0.23.0 wheel's file differs: d397a336...).
declare -A SHA=(
  [0.22.0]=ea3992481b4cfeb9d02fb55c7bdf1f6f159fb59b96f9574d19beea14513d3bc5
  [0.23.0]=e6c4ec769933eed073b58e259ffae8d48502328a24e25e678107707c10af7aed
  [0.24.0]=686ece5394839c1eb214ba91fdf0219e47fab4ccce0a69a10d3fba39db9a47fb
  [0.25.0]=186f5c6dde249b76984340b2d44d6f721f9aec7b88f5b976c01c019e76c61b10
  [0.26.0]=87a4360c79ec9278a4f359957755f370141bdb272a73f314bd43ce4e4279c6b4
  [0.27.0]=d60a4547504db80b5307bfa4d146c5e3278f95add4ccf585b7ed9570b41741f5
  [0.27.1]=f1540ca05e8c456817cf382cef4133bcbe7e90433f831fc834bf339e3d75dd12
  [0.28.0]=670960f482dc77e9e5ac5b55aa8c31f3b602389e09374c188fb68c10a5984a22
  [fa3-0.26.0]=ef90b69390afc0e579be5d12c57598879d57efe2fe38cecf05a9268f9bdd1cf3
  # the tar scripts/gpu/make_payloads.sh makes (directory times set: the same wheel makes the
  # same tar)
  [py26]=cd6911bfed39b3898a03fbaa81cd6aa8320beb60d06abf77dc421991ec5f4b7c
  # vllm/_moe_C_stable_libtorch.abi3.so (issue 40's MoE recipe), placed where
  # scripts/gpu/issue40.sh looks for it: so-moe-0.26.0.xz, so-moe-0.27.0.from-moe-0.26.0.zst
  [moe-0.26.0]=c4a1f9e89cf71f03b8c10d0364da46452f7ae7efb062b7ad7749383dc2239ccf
  [moe-0.27.0]=17f080d87f20e4a848b1583c37adf09f3ced5b70291b3f91d4499472b40599e6
)

log() { echo "[release_range] $*"; }
so_path() {  # V (vllm/_C_stable_libtorch) or moe-V (vllm/_moe_C_stable_libtorch)
  case $1 in
    moe-*) echo "$DEV/moe/${1#moe-}/vllm/_moe_C_stable_libtorch.abi3.so" ;;
    *) echo "$DEV/so/$1/vllm/_C_stable_libtorch.abi3.so" ;;
  esac
}
file_of() { echo "${FILE_OF[$1]:-$1}"; }

unxz_to() {  # SRC DEST (atomic: a killed call leaves no half file at DEST)
  mkdir -p "$(dirname "$2")"
  if command -v xz >/dev/null; then xz -dc -T0 "$1" >"$2.part"
  else "$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 20)' "$1" "$2.part"
  fi
  mv -f "$2.part" "$2"
}
untar_xz() {  # SRC DIR
  mkdir -p "$2"
  if command -v xz >/dev/null; then xz -dc -T0 "$1" | tar -C "$2" -xf -
  else "$PY" -c 'import tarfile,sys; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="tar")' "$1" "$2"
  fi
}
sha_ok() {  # FILE SHA
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}
recipe() {  # the bundled recipe completed for this machine (COLD=1: its files from $DEV/so)
  local f=$DEV/$RECIPE-range${COLD:+-cold}.toml gate="" drop=()
  local sources='sources = ["wheel-index", "release", "local", "source-build"]'
  # FlashInfer is not carried: without it both sampler settings run PyTorch's sampler
  [ "$SUSPECTS" = 1 ] || drop=(-e '/^\[probe\.suspects\]/,/^$/d')
  if [ -n "${COLD:-}" ]; then
    local v paths=()
    for v in "${RELEASES[@]}"; do paths+=("\"v$v\" = \"$DEV/so/$(file_of "$v")\""); done
    sources="sources = [\"local\"]\nlocal_paths = { $(IFS=,; echo "${paths[*]}") }"
  fi
  if [ -n "${GATE_OPS:-}" ]; then
    local ops; read -ra ops <<<"$GATE_OPS"
    gate="gate_ops = [$(printf '"%s", ' "${ops[@]}" | sed 's/, $//')]"
  fi
  # PER_GPU lifetimes at once on the GPU. Servers profiling one GPU at once each count the
  # other's memory as their own ("Available KV cache memory: -0.67 GiB", docs/h200/releases):
  # with more than one, each is told its KV cache size (--kv-cache-memory-bytes: no profile)
  local share="" OWN_SLOT=false per_gpu=$PER_GPU
  if [ "$PER_GPU" = auto ]; then
    per_gpu='"auto"'  # sized from the card when the run starts (the tool adds the KV size)
  elif [ "$PER_GPU" -gt 1 ]; then
    # and the controls' server gets a slot of its own beside them (three servers of ~4 GiB
    # on the card), so the confirm step keeps both lifetimes' slots
    OWN_SLOT=true
    share='\n  "--gpu-memory-utilization", "0.3",\n  "--kv-cache-memory-bytes", "3221225472",'
  fi
  sed -e "s|^backend = \"local\"|backend = \"local\"\npinned_package_dir = \"$DEV/site\"\npython = \"python3\"\ngpus = [$(echo "$GPUS" | sed 's/[^,][^,]*/\\"&\\"/g; s/,/, /g')]\nlifetimes_per_gpu = $per_gpu\ncontrols_own_slot = $OWN_SLOT${gate:+\\n$gate}|" \
      -e "s|^  \"--skip-tokenizer-init\",|  \"--skip-tokenizer-init\",$share|" \
      -e "/^\[runtime\.env\]/,/^\[/ s|^VLLM_BATCH_INVARIANT = \"1\"|VLLM_BATCH_INVARIANT = \"1\"\nVLLM_USE_FLASHINFER_SAMPLER = \"0\"|" \
      -e "s|^sources = \[.*\]$|$sources|" \
      -e "s|^weights = \"random:models/\(.*\)\"|weights = \"random:$PWD/bisect_tool/recipes/models/\1\"|" \
      "${drop[@]}" bisect_tool/recipes/"$RECIPE".toml >"$f"
  grep -q "^pinned_package_dir = \"$DEV/site\"" "$f" || { log "recipe: the bundled recipe changed; fix the sed in recipe()"; exit 2; }
  # The sampler switch goes into [runtime.env] alone: what the issue reported ([reported]) stays
  # the bundled recipe's (issue 41: a sed over the whole file set it in [reported.env] too, and
  # the report then showed no difference in the one setting #51187's thread argued about).
  "$PY" -c 'import sys, tomllib; r, b = (tomllib.load(open(p, "rb")) for p in sys.argv[1:]); sys.exit(r.get("reported") != b.get("reported"))' \
      "$f" bisect_tool/recipes/"$RECIPE".toml || { log "recipe: the sed changed [reported]; fix it in recipe()"; exit 2; }
  echo "$f"
}

step_stack() {
  local did=()
  if [ ! -f "$DEV/site/.ok" ]; then
    if [ -f "$CARRY/vllm026-py.tar.xz" ]; then
      rm -rf "$DEV/site" && mkdir -p "$DEV/site"
      unxz_to "$CARRY/vllm026-py.tar.xz" "$DEV/py26.tar"
      sha_ok "$DEV/py26.tar" "${SHA[py26]}" || { log "stack: vllm026-py.tar.xz does not unpack to the tar made for this script"; exit 1; }
      tar -C "$DEV/site" -xf "$DEV/py26.tar" && rm -f "$DEV/py26.tar" && touch "$DEV/site/.ok"
      did+=("site")
    else
      log "stack: site MISSING (carry .devcarry/vllm026-py.tar.xz)"
    fi
  fi
  if [ ! -f "$DEV/deps/.ok" ]; then
    if [ -f "$CARRY/deps-site.tar.xz" ]; then
      rm -rf "$DEV/deps" && untar_xz "$CARRY/deps-site.tar.xz" "$DEV/deps"
      # The tool's own dependencies the image already holds (filelock, rich, prometheus_client,
      # packaging) come as wheels, installed only when the image's copy is missing or older than
      # pyproject.toml asks: installed unconditionally they would shadow the image's for torch.
      local need
      need=$("$PY" - "$DEV/deps/.tool-wheels" <<'EOF'
import pathlib, sys
from importlib import metadata
mins = {"filelock": "3.12", "rich": "13", "prometheus_client": "0.20", "packaging": "24",
        "requests": "2.31", "psutil": "5.9"}
def key(v):
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())
for name, low in mins.items():
    try:
        ok = key(metadata.version(name)) >= key(low)
    except metadata.PackageNotFoundError:
        ok = False
    if not ok:
        for whl in pathlib.Path(sys.argv[1]).glob(name.replace("-", "_") + "-*.whl"):
            print(whl)
EOF
)
      if [ -n "$need" ]; then
        # shellcheck disable=SC2086  # one wheel path a word
        "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
          --target "$DEV/deps" $need
        did+=("tool wheels: $(echo "$need" | xargs -n1 basename | tr '\n' ' ')")
      fi
      echo "$(find "$DEV/deps" -maxdepth 1 -name '*.dist-info' | wc -l) dists" >"$DEV/deps/.ok"
      did+=("deps $(cat "$DEV/deps/.ok")")
    else
      log "stack: deps MISSING (carry .devcarry/deps-site.tar.xz)"
    fi
  fi
  local fa3=$DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so
  if [ -f "$DEV/site/.ok" ] && [ ! -f "$fa3.ok" ]; then
    if [ -f "$CARRY/fa3-0.26.0.xz" ]; then
      unxz_to "$CARRY/fa3-0.26.0.xz" "$fa3"
      sha_ok "$fa3" "${SHA[fa3-0.26.0]}" || { rm -f "$fa3"; log "stack: fa3-0.26.0.xz: sha256 mismatch"; exit 1; }
      touch "$fa3.ok" && did+=("fa3 0.26.0")
    else
      log "stack: fa3 MISSING (carry .devcarry/fa3-0.26.0.xz)"
    fi
  fi
  mkdir -p "$BISECT_CACHE_DIR/index"
  if [ -f "$CARRY/vllm-listing.json" ] && ! cmp -s "$CARRY/vllm-listing.json" "$BISECT_CACHE_DIR/index/vllm.json"; then
    cp "$CARRY/vllm-listing.json" "$BISECT_CACHE_DIR/index/vllm.json" && did+=("listing")
  fi
  [ -f "$BISECT_CACHE_DIR/index/vllm.json" ] || log "stack: listing MISSING (carry .devcarry/vllm-listing.json)"
  # `import vllm` loads vllm._C_stable_libtorch (vllm/platforms/cuda.py): checked once 0.26.0's
  # is placed (call 2's `so`; `verify` checks it then). Before, the import fails and ended the
  # step (the first call of 2026-12-07's second session)
  if [ -f "$DEV/site/.ok" ] && [ -f "$DEV/deps/.ok" ] && [ "${CHECK_IMPORT:-1}" = 1 ] \
    && [ -f "$(so_path 0.26.0).ok" ]; then
    "$PY" -c 'import vllm, fastapi, uvicorn, openai, msgspec, zmq, xgrammar, zstandard, git, tenacity, docker, platformdirs, tomlkit, pydantic
print("[release_range] stack: vllm", vllm.__version__, "and the tool deps import")'
  fi
  log "stack: ${did[*]:-nothing new}"
}

place_so() {  # V: 0 when it was placed now, 1 when it was already there or cannot be yet
  local v=$1 dest patch base
  dest=$(so_path "$v")
  [ -f "$dest.ok" ] && return 1
  if [ -f "$CARRY/so-$v.xz" ]; then
    unxz_to "$CARRY/so-$v.xz" "$dest" || { log "so: so-$v.xz did not unpack"; exit 1; }
    sha_ok "$dest" "${SHA[$v]}" || { rm -f "$dest"; log "so: so-$v.xz: sha256 mismatch"; exit 1; }
  else
    for patch in "$CARRY"/so-"$v".from-*.zst "$DEV"/pending/so-"$v".from-*.zst; do
      [ -f "$patch" ] || continue
      # so-V.from-B.zst, or so-V.from-B1+B2.zst: a delta from the two files concatenated
      # (0.24.0's extension holds much of 0.23.0's and of 0.25.0's; from both it is far smaller)
      base=${patch##*.from-}; base=${base%.zst}
      local parts=() b ref ready=1
      IFS=+ read -ra parts <<<"$base"
      for b in "${parts[@]}"; do [ -f "$(so_path "$b").ok" ] || ready=0; done
      ((ready)) || continue
      mkdir -p "$(dirname "$dest")"
      ref=$(so_path "${parts[0]}")
      if ((${#parts[@]} > 1)); then
        ref=$DEV/so/.ref-$base
        for b in "${parts[@]}"; do cat "$(so_path "$b")"; done >"$ref"
      fi
      # set -e does not reach into a function called as a condition: say and stop here
      "$PY" "$HERE/zpatch.py" "$ref" "$patch" "$dest" "${SHA[$v]}" >/dev/null \
        || { log "so: $(basename "$patch") did not apply"; exit 1; }
      [ "$ref" = "$(so_path "${parts[0]}")" ] || rm -f "$ref"
      break
    done
    [ -f "$dest" ] || return 1
  fi
  touch "$dest.ok"
  return 0
}

step_so() {
  local v f placed=() imported=() missing=() dest
  # Deltas apply once their base is placed; a base may itself be a delta: pass until no progress.
  local more=1
  while ((more)); do
    more=0
    for v in "${!SHA[@]}"; do
      case $v in fa3-*|py*) continue ;; esac
      if place_so "$v"; then placed+=("$v"); more=1; fi
    done
  done
  if [ -f "$(so_path 0.26.0).ok" ] && [ -d "$DEV/site/vllm" ] && [ ! -f "$DEV/site/vllm/_C_stable_libtorch.abi3.so" ]; then
    ln "$(so_path 0.26.0)" "$DEV/site/vllm/_C_stable_libtorch.abi3.so"  # the pinned stack's own
  fi
  for v in "${RELEASES[@]}"; do
    f=$(file_of "$v")
    dest=$(so_path "$f")
    if [ -f "$DEV/so/.imported-$v" ]; then continue; fi
    if [ -f "$dest.ok" ]; then
      "$PY" -m bisect_tool artifacts import --recipe batch-invariance --release "$v" "$dest" >/dev/null
      touch "$DEV/so/.imported-$v" && imported+=("$v${FILE_OF[$v]:+=$f}")
    else
      missing+=("$v")
    fi
  done
  # A delta that came before its base waits in $DEV/pending: the next call's carry replaces
  # .devcarry, /tmp/dev stays while the machine is warm.
  local patch
  for patch in "$CARRY"/so-*.from-*.zst; do
    [ -f "$patch" ] || continue
    v=${patch##*/so-}; v=${v%%.from-*}
    [ -f "$(so_path "$v").ok" ] || { mkdir -p "$DEV/pending"; cp -u "$patch" "$DEV/pending/"; }
  done
  local waiting=()
  for v in "${missing[@]}"; do
    f=$(file_of "$v")
    if compgen -G "$DEV/pending/so-$f.from-*.zst" >/dev/null; then
      waiting+=("$v (its delta's base is not placed yet)")
    else
      waiting+=("$v (carry so-$f.xz or so-$f.from-BASE.zst)")
    fi
  done
  local n=0
  for v in "${RELEASES[@]}"; do [ -f "$DEV/so/.imported-$v" ] && n=$((n + 1)); done
  log "so: placed ${placed[*]:-none}; imported ${imported[*]:-none}; $n/${#RELEASES[@]} releases in the cache${waiting:+; missing: ${waiting[*]}}"
}

all_imported() {
  local v missing=()
  for v in "${RELEASES[@]}"; do [ -f "$DEV/so/.imported-$v" ] || missing+=("$v"); done
  if ((${#missing[@]})); then
    log "not every release is in the cache (${missing[*]}): carry their payloads and run the so step first"
    return 1
  fi
}

step_verify() {
  [ -f "$DEV/site/vllm/_C_stable_libtorch.abi3.so" ] || { log "verify: 0.26.0's extension is not placed yet (so step)"; return 1; }
  "$PY" -c "
import time; t = time.time()
import vllm.entrypoints.openai.api_server, vllm._C_stable_libtorch, torch
print('[release_range] verify: server module imports in %.1f s; torch %s, cuda %s, %s' % (
    time.time() - t, torch.__version__, torch.cuda.is_available(),
    torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'))
"
  "$PY" -m bisect_tool artifacts ls
}

step_model() {
  local r; r=$(recipe)
  "$PY" -c '
import sys
from bisect_tool.recipes import recipe
from bisect_tool.runtime.weights import resolve_weights
print("[release_range] model:", resolve_weights(recipe.load(sys.argv[1]), progress=print).runtime.model)
' "$r"
}

run_bisect() {  # MODE [start flags...]
  local mode=$1; shift
  local sd=$DEV/state-$mode r rc t0 state
  all_imported || return 1
  if [ "$mode" = cold ]; then
    # an emptied cache with only the listing (no index is reachable here); emptied once, at the
    # run's start: a resumed cold run keeps what it fetched
    export BISECT_CACHE_DIR=$DEV/cache-cold COLD=1
    if [ ! -f "$sd/journal.jsonl" ]; then
      rm -rf "$BISECT_CACHE_DIR" && mkdir -p "$BISECT_CACHE_DIR/index"
      cp "$DEV/cache/index/vllm.json" "$BISECT_CACHE_DIR/index/vllm.json"
      # the random checkpoint is the model, not an artifact: the same one as the cached runs'
      [ -d "$DEV/cache/models" ] && cp -r "$DEV/cache/models" "$BISECT_CACHE_DIR/models"
    fi
  fi
  r=$(recipe)
  if [ -f "$sd/journal.jsonl" ]; then
    state=$("$PY" -m bisect_tool status --json --state-dir "$sd" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    if [ "$state" != running ]; then
      log "$mode: already ended ($state); $(total "$mode")"
      return 0
    fi
  fi
  t0=$(date +%s)
  set +e
  if [ -f "$sd/journal.jsonl" ]; then
    timeout --signal=TERM --kill-after=60 "$DEADLINE_S" "$PY" -m bisect_tool resume --state-dir "$sd" -v 2>&1 | tee -a "$OUT/bisect-$mode.log"
  else
    timeout --signal=TERM --kill-after=60 "$DEADLINE_S" "$PY" -m bisect_tool start --releases --good "$GOOD" --bad "$BAD" \
      --recipe "$r" --state-dir "$sd" -v "$@" 2>&1 | tee "$OUT/bisect-$mode.log"
  fi
  rc=${PIPESTATUS[0]}
  set -e
  echo -e "$(date -u +%FT%TZ)\t$(( $(date +%s) - t0 ))\t$rc" >>"$DEV/times-$mode.tsv"
  "$PY" -m bisect_tool status --state-dir "$sd" || true
  log "$mode: exit $rc$([ "$rc" = 124 ] && echo ' (deadline: the next call resumes it)'); $(total "$mode")"
}

total() {  # MODE: the seconds of every call of this run so far
  awk -F'\t' '{s += $2; n++} END {printf "%d s over %d call(s)", s, n}' "$DEV/times-$1.tsv" 2>/dev/null || echo "not run"
}

step_report() {
  # A call brings back at most 8 files: the journals apart (bench/gpu_record.py reads them),
  # everything else in one archive.
  local mode sd rec=$DEV/record
  rm -rf "$rec" && mkdir -p "$rec"
  for mode in "tiered$TAG" "tiered-again$TAG" "nonarrow$TAG" cold; do
    sd=$DEV/state-$mode
    [ -f "$sd/journal.jsonl" ] || { log "report: $mode has no journal"; continue; }
    "$PY" -m bisect_tool report --state-dir "$sd" -o "$rec/report-$mode.md" || true
    "$PY" -m bisect_tool report --state-dir "$sd" --format json -o "$rec/report-$mode.json" || true
    "$PY" -m bisect_tool status --json --state-dir "$sd" >"$rec/status-$mode.json" || true
    cp "$sd/journal.jsonl" "$OUT/journal-$mode.jsonl"
    cp "$DEV/times-$mode.tsv" "$rec/times-$mode.tsv" 2>/dev/null || true
    mkdir -p "$rec/logs-$mode" && cp -r "$sd/logs/." "$rec/logs-$mode/" 2>/dev/null || true
    log "report: $mode $(total "$mode")"
  done
  tar -C "$rec" -czf "$OUT/record.tgz" .
}

for step in "$@"; do
  t0=$(date +%s)
  case $step in
    stack) step_stack ;;
    so) step_so ;;
    verify) step_verify ;;
    model) step_model ;;
    bisect) run_bisect "tiered$TAG" ;;
    again) run_bisect "tiered-again$TAG" ;;
    nonarrow) run_bisect "nonarrow$TAG" --no-narrow ;;
    cold) (run_bisect cold) ;;
    report) step_report ;;
    recipe) log "recipe: $(recipe)" ;;  # the recipe the runs use, written and checked alone
    *) echo "unknown step $step (stack, so, verify, model, bisect, again, nonarrow, cold, report, recipe)" >&2; exit 2 ;;
  esac
  log "$step done ($(( $(date +%s) - t0 )) s)"
done
