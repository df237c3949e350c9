#!/usr/bin/env bash
# Unpack whatever payloads this device call carried into /tmp/dev; idempotent, re-runnable.
#
# Runs ON THE GPU MACHINE, from the repo root (the device tool's working directory). Each call
# carries at most 64 MiB, so the pinned stack arrives over several chained calls (see
# docs/gpu-runbook.md); /tmp/dev survives between calls only while the machine stays warm (30 s),
# so this script re-checks everything each time and says which payload is missing.
#
#   .devcarry/vllm026-py.tar.xz  -> /tmp/dev/site      vLLM 0.26.0's Python side (no GPU .so)
#   .devcarry/deps-site.tar.xz   -> /tmp/dev/deps      missing dependencies, installed (preferred)
#   .devcarry/deps.tar           -> /tmp/dev/deps      the same as wheels, pip --target there
#   .devcarry/fa3.xz             -> /tmp/dev/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so
#   .devcarry/so26.xz            -> /tmp/dev/0.26.0/vllm/_C_stable_libtorch.abi3.so
#   .devcarry/so27.xz            -> /tmp/dev/0.27.0/vllm/_C_stable_libtorch.abi3.so
#
# The pinned stack is v0.26.0 whole: once so26 is there it is also hard-linked into
# /tmp/dev/site/vllm/, so the pinned package holds its own _C_stable_libtorch (the local backend's
# overlay swaps the candidate's file over it; `bisect` checks op schemas against the pinned one).
#
# Usage: scripts/gpu/setup_stack.sh [--verify none|deps|server] [--only-so]   (default: deps)
#   deps:   import vllm and every dependency module the server imports (no GPU .so needed)
#   server: also import vllm.entrypoints.openai.api_server (needs so26 in place: the CUDA
#           platform imports vllm._C_stable_libtorch at module level)
# Prints `export PYTHONPATH=...` for the caller; exit 0 when the verification passed.
set -euo pipefail

DEV=${DEV:-/tmp/dev}
CARRY=${CARRY:-.devcarry}
VERIFY=deps
ONLY_SO=0
while (($#)); do
  case $1 in
    --verify) VERIFY=${2:?--verify needs none, deps or server}; shift 2 ;;
    --only-so) ONLY_SO=1; VERIFY=none; shift ;;  # just the hash-checked .so files (op probe)
    *) echo "usage: setup_stack.sh [--verify none|deps|server] [--only-so]" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$DEV"
# Hashes of the uncompressed extension files (printed by `bisect artifacts extract`).
declare -A SHA=(
  [0.26.0]=87a4360c79ec9278a4f359957755f370141bdb272a73f314bd43ce4e4279c6b4
  [0.27.0]=d60a4547504db80b5307bfa4d146c5e3278f95add4ccf585b7ed9570b41741f5
  [fa3]=ef90b69390afc0e579be5d12c57598879d57efe2fe38cecf05a9268f9bdd1cf3
)

log() { echo "[setup_stack] $*"; }

# xz may be missing from the image; Python's lzma reads the same streams.
unxz_to() {  # SRC DEST: decompress atomically (a killed call leaves no half file at DEST)
  mkdir -p "$(dirname "$2")"
  if command -v xz >/dev/null; then
    xz -dc -T0 "$1" >"$2.part"
  else
    python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"), 1 << 20)' "$1" "$2.part"
  fi
  mv -f "$2.part" "$2"
}

untar_xz() {  # SRC DIR
  mkdir -p "$2"
  if command -v xz >/dev/null; then
    xz -dc -T0 "$1" | tar -x -C "$2"
  else
    python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="tar")' "$1" "$2"
  fi
}

check_sha() {  # FILE EXPECTED
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [[ $got != "$2" ]]; then
    log "FAIL: $1 has sha256 $got, expected $2 (corrupt or wrong payload)"
    rm -f "$1"
    return 1
  fi
}

# 1. vLLM 0.26.0's Python side.
if ((ONLY_SO)); then
  :
elif [[ -f $DEV/site/.ok ]]; then
  log "site: present ($(cat "$DEV/site/.ok"))"
elif [[ -f $CARRY/vllm026-py.tar.xz ]]; then
  rm -rf "$DEV/site"
  untar_xz "$CARRY/vllm026-py.tar.xz" "$DEV/site"
  echo "vllm026-py $(du -sb "$DEV/site" | cut -f1) bytes" >"$DEV/site/.ok"
  log "site: unpacked $(cat "$DEV/site/.ok")"
else
  log "site: MISSING (carry .devcarry/vllm026-py.tar.xz: call 1 of docs/gpu-runbook.md)"
fi

# 2. Dependency wheels -> /tmp/dev/deps (pip installs offline, no resolution: the set is closed).
if ((ONLY_SO)); then
  :
elif [[ -f $DEV/deps/.ok ]]; then
  log "deps: present ($(cat "$DEV/deps/.ok"))"
elif [[ -f $CARRY/deps-site.tar.xz ]]; then
  # Preferred: the same wheels installed here with `pip install --target` for CPython 3.12
  # manylinux x86_64 and xz'd (24 MB against 47 MB of wheels), so call 1 fits with room.
  rm -rf "$DEV/deps"
  untar_xz "$CARRY/deps-site.tar.xz" "$DEV/deps"
  echo "deps-site $(ls -d "$DEV"/deps/*.dist-info | wc -l) dists" >"$DEV/deps/.ok"
  log "deps: unpacked $(cat "$DEV/deps/.ok")"
elif [[ -f $CARRY/deps.tar ]]; then
  rm -rf "$DEV/deps" "$DEV/wheels"
  mkdir -p "$DEV/wheels"
  tar -xf "$CARRY/deps.tar" -C "$DEV/wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$DEV/deps" "$DEV"/wheels/*.whl
  echo "$(ls "$DEV"/wheels/*.whl | wc -l) wheels" >"$DEV/deps/.ok"
  rm -rf "$DEV/wheels"
  log "deps: installed $(cat "$DEV/deps/.ok")"
else
  log "deps: MISSING (carry .devcarry/deps-site.tar.xz: call 1 of docs/gpu-runbook.md)"
fi

# 3. Compiled files. Each lands beside a .ok only after its hash matched.
place() {  # PAYLOAD DEST KEY
  if [[ -f $2 && -f $2.ok ]]; then
    log "$3: present"
  elif [[ -f $1 ]]; then
    unxz_to "$1" "$2"
    check_sha "$2" "${SHA[$3]}"
    touch "$2.ok"
    log "$3: unpacked $2 ($(stat -c %s "$2") bytes, sha256 ok)"
  else
    log "$3: not here (carry $1)"
  fi
}
place "$CARRY/so26.xz" "$DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so" 0.26.0
place "$CARRY/so27.xz" "$DEV/0.27.0/vllm/_C_stable_libtorch.abi3.so" 0.27.0
if [[ -d $DEV/site/vllm ]]; then
  place "$CARRY/fa3.xz" "$DEV/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" fa3
  if [[ -f $DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so.ok ]]; then
    ln -f "$DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so" "$DEV/site/vllm/_C_stable_libtorch.abi3.so"
  fi
elif [[ -f $CARRY/fa3.xz ]]; then
  log "fa3: carried but the site is missing; carry vllm026-py.tar.xz first"
fi

export PYTHONPATH="$DEV/site:$DEV/deps${PYTHONPATH:+:$PYTHONPATH}"
echo "export PYTHONPATH=$PYTHONPATH"

# 4. Verify.
case $VERIFY in
  none) exit 0 ;;
  deps)
    # The modules the OpenAI server imports at boot that the image lacks (scripts/gpu/README.md).
    python3 - <<'EOF'
import importlib, sys, time
t = time.time()
import vllm
print("vllm", vllm.__version__, "from", vllm.__file__)
mods = ["fastapi", "starlette", "uvicorn", "pydantic", "openai", "anthropic", "mcp", "zmq",
        "msgspec", "cbor2", "pybase64", "blake3", "xgrammar", "llguidance", "outlines_core",
        "lark", "lmformatenforcer", "compressed_tensors", "depyf", "mistral_common",
        "partial_json_parser", "prometheus_fastapi_instrumentator", "openai_harmony",
        "model_hosting_container_standards", "opentelemetry.sdk", "watchfiles", "setproctitle",
        "ijson", "cachetools", "pythonjsonlogger", "python_multipart", "jsonschema", "git", "tenacity",
        "docker", "transformers", "safetensors", "tokenizers", "torch", "triton"]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as exc:  # report every missing one, not just the first
        bad.append(f"{m}: {type(exc).__name__}: {exc}")
print(f"imported {len(mods) - len(bad)}/{len(mods)} modules in {time.time() - t:.1f} s")
for b in bad:
    print("MISSING", b)
sys.exit(1 if bad else 0)
EOF
    ;;
  server)
    python3 -c "
import time; t = time.time()
import vllm.entrypoints.openai.api_server, vllm._C_stable_libtorch, torch
print('server module imports in %.1f s; torch %s, cuda %s' % (time.time() - t, torch.__version__, torch.cuda.is_available()))
print('rms_norm op:', torch.ops._C.rms_norm)
"
    ;;
  *) log "unknown --verify $VERIFY"; exit 2 ;;
esac
