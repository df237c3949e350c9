#!/usr/bin/env bash
# The GPU session's payloads and steps, dry-run here (no GPU, no torch): what docs/gpu-runbook.md's
# "The calls" do before any server boots, in a scratch $DEV, with a CPython 3.12 (the device's)
# that has only what the device image has that the tool needs (click, httpx, numpy, ...).
#
#   scripts/gpu/dry_run.sh [CARRY_ROOT]      (default /work/main/.devcarry; run from the repo root)
#
#   1. every payload against MANIFEST.txt (bytes, sha256) and each call's folder against the
#      64 MiB a call carries with this working tree
#   2. release_range.sh stack, then so with each call's folder in turn (CARRY=ROOT/cN), as the
#      chained calls would: the site's tar hash, FA3's hash, the deltas applied in whatever order
#      they come (zpatch.py with the carried python-zstandard) to the right sha256, and
#      `bisect artifacts import --release V` for the ten releases; then the MoE pair
#   3. the deps that import without torch, from $DEV/deps, by the 3.12 interpreter
#   4. cold_range.sh build (layout auto), the loopback index served, and one release's swap set
#      fetched from it the way this checkout's release source fetches (whole wheel, or members)
#
# Env: DEV (/tmp/devsim), PY (/tmp/devsim-py/bin/python: made here if missing, a 3.12 venv).
set -euo pipefail
ROOT=$(cd "${1:-/work/main/.devcarry}" && pwd)
export DEV=${DEV:-/tmp/devsim}
PY312=${PY312:-$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}
export PY=${PY:-/tmp/devsim-py/bin/python}
export OUT=$DEV/out
say() { echo "[dry_run] $*"; }
if [ ! -x "$PY" ]; then
  "$PY312" -m venv "$(dirname "$(dirname "$PY")")"
  # what the device image has that the tool and the deps set lean on (KINDS.md's package list)
  "$PY" -m pip install -q click httpx numpy packaging filelock rich prometheus_client requests \
    psutil pyyaml annotated-doc attrs
fi
say "interpreter $("$PY" -c 'import sys; print(sys.version.split()[0])') ($PY)"

# 1. the payloads
(cd "$ROOT" && awk -F'\t' 'NR > 2 {print $3 "  " $1}' MANIFEST.txt | sha256sum -c --quiet) \
  && say "payloads: $(awk 'NR > 2' "$ROOT/MANIFEST.txt" | wc -l) match MANIFEST.txt"
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r du -cb | tail -1 | cut -f1)
for c in "$ROOT"/c[0-9]*; do
  [ -d "$c" ] || continue
  bytes=$(du -cbL "$c"/* | tail -1 | cut -f1)
  total=$((bytes + tree + ${untracked:-0}))
  say "$(basename "$c"): $bytes bytes of payloads + $tree tracked + ${untracked:-0} untracked = $total of 67108864 ($(( (67108864 - total) / 1000 )) kB to spare)"
  ((total <= 67108864)) || { say "$(basename "$c") does not fit"; exit 1; }
done

# 2. the steps, call by call
rm -rf "$DEV" && mkdir -p "$DEV" "$OUT"
export CHECK_IMPORT=0  # `import vllm` needs torch: step 3 imports what does not
for c in "$ROOT"/c[0-9]*; do
  say "--- CARRY=$c"
  CARRY=$c bash scripts/gpu/release_range.sh stack so
done
BISECT_CACHE_DIR=$DEV/cache PYTHONPATH=$PWD:$DEV/site:$DEV/deps "$PY" -m bisect_tool artifacts ls
for v in 0.26.0 0.27.0; do
  f=$DEV/moe/$v/vllm/_moe_C_stable_libtorch.abi3.so
  [ -f "$f.ok" ] && say "moe $v: $(sha256sum "$f" | cut -c1-16)... placed" || say "moe $v: NOT placed"
done

# 3. the deps that import without torch
PYTHONPATH=$PWD:$DEV/site:$DEV/deps "$PY" - <<'EOF'
import importlib
mods = ["fastapi", "starlette", "uvicorn", "pydantic", "openai", "anthropic", "mcp", "zmq",
        "msgspec", "cbor2", "pybase64", "blake3", "llguidance", "outlines_core", "lark",
        "partial_json_parser", "prometheus_fastapi_instrumentator", "openai_harmony",
        "model_hosting_container_standards", "opentelemetry.sdk", "watchfiles", "setproctitle",
        "ijson", "cachetools", "pythonjsonlogger", "python_multipart", "jsonschema", "git",
        "tenacity", "docker", "platformdirs", "zstandard", "tomlkit", "tvm_ffi", "mistral_common",
        "bisect_tool.cli"]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as exc:
        bad.append(f"{m}: {type(exc).__name__}: {exc}")
print(f"[dry_run] imports: {len(mods) - len(bad)}/{len(mods)} without torch")
for b in bad:
    print("[dry_run] MISSING", b)
import zstandard
print("[dry_run] zstandard backend:", zstandard.backend)
EOF

# 4. the cold run's index: the layout this checkout's release source needs (auto), then sparse
#    (byte-exact for a member fetch) read through the tool's member fetch, whatever the source does
check_host() {  # LAYOUT VERSION
  local url host
  rm -f "$DEV/url"
  PYTHONPATH=$PWD:$DEV/site:$DEV/deps "$PY" scripts/gpu/release_host.py serve --dir "$DEV/host-$1" \
    --rate-mb-s 0 --port-file "$DEV/url" --seconds 120 >"$DEV/serve-$1.log" 2>&1 &
  host=$!
  for _ in $(seq 100); do [ -f "$DEV/url" ] && break; sleep 0.1; done
  PYTHONPATH=$PWD:$DEV/site:$DEV/deps "$PY" - "$(cat "$DEV/url")" "$2" "$1" <<'PYEOF'
import sys, tempfile, time
from pathlib import Path
import httpx
from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.download import Downloader
from bisect_tool.artifacts.extract import sha256_file
from bisect_tool.artifacts.index import fetch_project_files
from bisect_tool.artifacts.members import fetch_members
from bisect_tool.artifacts.release_source import ReleaseSource
url, version, layout = sys.argv[1:4]
member = "vllm/_C_stable_libtorch.abi3.so"
with httpx.Client(timeout=60) as client, tempfile.TemporaryDirectory() as tmp:
    work = Path(tmp)
    downloader = Downloader(client)
    t0 = time.time()
    if layout == "sparse":  # the member fetch, by range, as the wheel-index source does it
        files, _ = fetch_project_files(downloader, url + "/simple", "vllm")
        wheel = next(f for f in files if f.filename.startswith(f"vllm-{version}-")
                     and f.filename.endswith("manylinux_2_28_x86_64.whl"))
        got = fetch_members(downloader, wheel.url, [member], work)
        path, how = got.files[0].path, f"members by range, {got.bytes} bytes"
    else:  # this checkout's release source, as the run calls it
        fetched = ReleaseSource(url + "/simple", "vllm", downloader, work).fetch(
            f"vllm-{version}", [f"v{version}"], work)
        if fetched.kind == "wheel":
            swap = ArtifactCache(work / "cache").add_wheel(
                f"vllm-{version}", fetched.path, [member], source="release",
                origin=fetched.origin, wheel_sha256=fetched.wheel_sha256)
            path, how = next(iter(swap.files.values())), "whole wheel, sha256 checked"
        else:
            path, how = fetched.members[0].path, "members"
    print(f"[dry_run] cold fetch of {version} from the {layout} index ({how}): "
          f"_C_stable_libtorch sha256 {sha256_file(path)[:16]}... in {time.time() - t0:.1f} s")
PYEOF
  kill "$host" 2>/dev/null || true
}
CARRY=$ROOT/c1 PYTHONPATH=$PWD:$DEV/site:$DEV/deps bash scripts/gpu/cold_range.sh build
auto=$(ls -d "$DEV"/host-* | head -1); auto=${auto##*host-}
check_host "$auto" 0.25.1
if [ "$auto" != sparse ]; then
  CARRY=$ROOT/c1 LAYOUT=sparse PYTHONPATH=$PWD:$DEV/site:$DEV/deps bash scripts/gpu/cold_range.sh build
  check_host sparse 0.23.0
fi
say "done"
