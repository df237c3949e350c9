#!/usr/bin/env bash
# Make (here, the machine with PyPI) every payload of docs/gpu-runbook.md's "Payloads for the
# next GPU session" into DEST (the lead's checkout's .devcarry/, ignored by git), and
# DEST/MANIFEST.txt: name, bytes, sha256, what it is, which call carries it. Idempotent: a
# payload already in DEST is kept (delete it to make it again). ~40 min on 2 busy cores, mostly
# xz -9 and zstd -19.
#
#   scripts/gpu/make_payloads.sh [DEST]      (default /work/main/.devcarry)
#
# Env: WHEELS (/work/wheels: the ten vLLM wheels, `pip download --no-deps ... vllm==V`),
# WORK (/tmp/gpuprep: scratch), PY (.venv/bin/python, for fetch_deps.py and the listing).
set -euo pipefail
DEST=${1:-/work/main/.devcarry}
WHEELS=${WHEELS:-/work/wheels}
WORK=${WORK:-/tmp/gpuprep}
PY=${PY:-.venv/bin/python}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RELEASES=(0.22.0 0.22.1 0.23.0 0.24.0 0.25.0 0.25.1 0.26.0 0.27.0 0.27.1 0.28.0)
mkdir -p "$DEST" "$WORK/so" "$WORK/moe"
log() { echo "[make_payloads] $*"; }
wheel() { ls "$WHEELS"/vllm-"$1"-*cp38-abi3-manylinux_2_28_x86_64.whl | sort -r | head -1; }  # 0.23.0-2 first
# deterministic tars: names sorted, owner 0, one directory time
det_tar() { tar -C "$1" --sort=name --owner=0 --group=0 --numeric-owner --format=gnu -cf - "${@:2}"; }

for v in "${RELEASES[@]}"; do
  w=$(wheel "$v") || { log "no wheel of $v in $WHEELS: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 -d $WHEELS vllm==$v"; exit 1; }
  [ -f "$WORK/so/$v.so" ] || unzip -p "$w" vllm/_C_stable_libtorch.abi3.so >"$WORK/so/$v.so"
done
for v in 0.26.0 0.27.0; do
  [ -f "$WORK/moe/$v.so" ] || unzip -p "$(wheel "$v")" vllm/_moe_C_stable_libtorch.abi3.so >"$WORK/moe/$v.so"
done

# 1. The pinned Python side: 0.26.0's wheel minus its GPU kernels
if [ ! -f "$DEST/vllm026-py.tar.xz" ]; then
  rm -rf "$WORK/w26" && unzip -q "$(wheel 0.26.0)" -d "$WORK/w26"
  find "$WORK/w26" -type d -exec touch -h -d '2026-07-25 02:09:00 UTC' {} +
  (cd "$WORK/w26" && find vllm -name '*.so' | grep -E '/_C_stable_libtorch|/_moe_C_stable_libtorch|/_flashmla|/_qutlass_C|/_vllm_fa[23]_C|/third_party/deep_gemm/_C\.' | sort) >"$WORK/excl.txt"
  det_tar "$WORK/w26" -X "$WORK/excl.txt" vllm vllm-0.26.0.dist-info >"$WORK/py26.tar"
  log "py26.tar sha256 $(sha256sum "$WORK/py26.tar" | cut -c1-64) (release_range.sh SHA[py26])"
  xz -9 -T1 -c "$WORK/py26.tar" >"$DEST/vllm026-py.tar.xz"
fi

# 2. Dependencies: vLLM 0.26.0's the image lacks (fetch_deps.py), pinned to the versions that
#    ran on the device (deps-wheels.txt), apache-tvm-ffi for xgrammar, the tool's own
if [ ! -f "$DEST/deps-site.tar.xz" ]; then
  rm -rf "$WORK/deps" "$WORK/depsite" && mkdir -p "$WORK/deps" "$WORK/toolw"
  "$PY" "$HERE/fetch_deps.py" "$(wheel 0.26.0)" --dest "$WORK/deps" \
    --also gitpython docker tenacity platformdirs zstandard "tomlkit>=0.12" >"$WORK/fetch_deps.log" 2>&1 || true
  P=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
  # a newer release of a name than deps-wheels.txt's (which ran on the device) is replaced by it
  while read -r pinned; do
    name=${pinned%%-[0-9]*}
    for got in "$WORK/deps/$name"-*.whl; do
      [ -f "$got" ] && [ "$(basename "$got")" != "$pinned" ] || continue
      rm -f "$got"
      python3 -m pip download -q --no-deps --only-binary=:all: "${P[@]}" -d "$WORK/deps" \
        "$name==$(echo "$pinned" | cut -d- -f2)"
    done
  done <"$HERE/deps-wheels.txt"
  python3 -m pip download -q --no-deps --only-binary=:all: "${P[@]}" -d "$WORK/deps" apache-tvm-ffi==0.1.11
  python3 -m pip download -q --no-deps --only-binary=:all: "${P[@]}" -d "$WORK/toolw" \
    filelock rich prometheus_client packaging psutil requests
  python3 -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: "${P[@]}" \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_26_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    --platform linux_x86_64 --target "$WORK/depsite" "$WORK"/deps/*.whl
  rm -rf "$WORK/depsite/bin"
  # python-zstandard's C backend is what it imports first; its cffi twin (12 MB) is left out
  rm -f "$WORK"/depsite/zstandard/_cffi.*.so
  mkdir -p "$WORK/depsite/.tool-wheels" && cp "$WORK"/toolw/*.whl "$WORK/depsite/.tool-wheels/"
  find "$WORK/depsite" -exec touch -h -d '2026-12-07 00:00:00 UTC' {} +
  det_tar "$WORK/depsite" . | xz -9 -T1 >"$DEST/deps-site.tar.xz"
fi

# 3. FA3 of 0.26.0 (FLASH_ATTN on Hopper)
[ -f "$DEST/fa3-0.26.0.xz" ] || unzip -p "$(wheel 0.26.0)" vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so | xz -9 -T1 >"$DEST/fa3-0.26.0.xz"

# 4. Each release's _C_stable_libtorch: 0.26.0 whole, the rest as zstd deltas along the chain
#    that measured smallest (docs/gpu-runbook.md); 0.22.1 = 0.22.0 and 0.25.1 = 0.25.0
[ -f "$DEST/so-0.26.0.xz" ] || xz -9 -T1 -c "$WORK/so/0.26.0.so" >"$DEST/so-0.26.0.xz"
for edge in 0.25.0:0.26.0 0.24.0:0.25.0 0.23.0:0.24.0 0.22.0:0.23.0 0.27.0:0.26.0 0.27.1:0.27.0 0.28.0:0.27.0; do
  t=${edge%%:*} b=${edge##*:}
  f=$DEST/so-$t.from-$b.zst
  [ -f "$f" ] || zstd -q -19 --long=27 --patch-from="$WORK/so/$b.so" "$WORK/so/$t.so" -o "$f"
done
# 5. _moe_C_stable_libtorch of 0.26.0 (whole) and 0.27.0 (delta)
[ -f "$DEST/so-moe-0.26.0.xz" ] || xz -9 -T1 -c "$WORK/moe/0.26.0.so" >"$DEST/so-moe-0.26.0.xz"
[ -f "$DEST/so-moe-0.27.0.from-moe-0.26.0.zst" ] || zstd -q -19 --long=27 \
  --patch-from="$WORK/moe/0.26.0.so" "$WORK/moe/0.27.0.so" -o "$DEST/so-moe-0.27.0.from-moe-0.26.0.zst"

# 6. The PyPI listing of vllm (the runs list releases offline), PyPI's alone
if [ ! -f "$DEST/vllm-listing.json" ]; then
  rm -rf "$WORK/lcache"
  env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null PIP_INDEX_URL=https://pypi.org/simple "$PY" -c "
from pathlib import Path
from bisect_tool.artifacts.releases import fetch_listing
print(len(fetch_listing('vllm', 'https://pypi.org/simple', Path('$WORK/lcache')).releases), 'releases')"
  cp "$WORK/lcache/index/vllm.json" "$DEST/vllm-listing.json"
fi

# 7. The ten wheels' heads for the cold-cache run's loopback index (release_host.py)
if [ ! -f "$DEST/wheel-heads.tar.xz" ]; then
  rm -rf "$WORK/heads"
  ws=(); for v in "${RELEASES[@]}"; do ws+=("$(wheel "$v")"); done
  python3 "$HERE/release_host.py" heads "${ws[@]}" --out "$WORK/heads"
  find "$WORK/heads" -exec touch -h -d '2026-12-07 00:00:00 UTC' {} +
  det_tar "$WORK/heads" . | xz -9 -T1 >"$DEST/wheel-heads.tar.xz"
fi

# The manifest: each payload, its bytes and sha256, what it is, the call that carries it
# (docs/gpu-runbook.md, "The calls"). Checked with: cd DEST && awk 'NR>2{print $3"  "$1}' MANIFEST.txt | sha256sum -c
declare -A WHAT=(
  [vllm026-py.tar.xz]="vLLM 0.26.0 wheel minus GPU kernels (tar sha256 = release_range.sh SHA[py26]) -> \$DEV/site"
  [deps-site.tar.xz]="vLLM 0.26.0's missing deps + tool deps, pip --target cp312 manylinux; .tool-wheels/ -> \$DEV/deps"
  [fa3-0.26.0.xz]="vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so of 0.26.0 -> \$DEV/site"
  [vllm-listing.json]="PyPI's listing of vllm (bisect_tool fetch_listing) -> \$DEV/cache/index/vllm.json"
  [wheel-heads.tar.xz]="the ten x86_64 wheels' end records, central directories, local headers (release_host.py heads) -> \$DEV/heads"
  [so-0.26.0.xz]="_C_stable_libtorch of 0.26.0, whole (the chain's root) -> \$DEV/so/0.26.0"
  [so-0.25.0.from-0.26.0.zst]="_C_stable_libtorch of 0.25.0 (= 0.25.1), delta from 0.26.0's"
  [so-0.24.0.from-0.25.0.zst]="_C_stable_libtorch of 0.24.0, delta from 0.25.0's"
  [so-0.23.0.from-0.24.0.zst]="_C_stable_libtorch of 0.23.0 (the -2 wheel's), delta from 0.24.0's"
  [so-0.22.0.from-0.23.0.zst]="_C_stable_libtorch of 0.22.0 (= 0.22.1), delta from 0.23.0's"
  [so-0.27.0.from-0.26.0.zst]="_C_stable_libtorch of 0.27.0, delta from 0.26.0's"
  [so-0.27.1.from-0.27.0.zst]="_C_stable_libtorch of 0.27.1, delta from 0.27.0's"
  [so-0.28.0.from-0.27.0.zst]="_C_stable_libtorch of 0.28.0, delta from 0.27.0's"
  [so-moe-0.26.0.xz]="_moe_C_stable_libtorch of 0.26.0, whole -> \$DEV/moe/0.26.0"
  [so-moe-0.27.0.from-moe-0.26.0.zst]="_moe_C_stable_libtorch of 0.27.0, delta from 0.26.0's -> \$DEV/moe/0.27.0"
)
declare -A CALL=(
  [vllm026-py.tar.xz]=1 [deps-site.tar.xz]=1 [fa3-0.26.0.xz]=1 [vllm-listing.json]=1
  [wheel-heads.tar.xz]=1 [so-0.27.1.from-0.27.0.zst]=1 [so-0.22.0.from-0.23.0.zst]=1
  [so-0.26.0.xz]=2 [so-0.25.0.from-0.26.0.zst]=2
  [so-0.24.0.from-0.25.0.zst]=3 [so-0.23.0.from-0.24.0.zst]=3 [so-0.27.0.from-0.26.0.zst]=3
  [so-0.28.0.from-0.27.0.zst]=3 [so-moe-0.27.0.from-moe-0.26.0.zst]=3
  [so-moe-0.26.0.xz]=5
)
{
  echo "# payloads for docs/gpu-runbook.md \"The calls\" (made by scripts/gpu/make_payloads.sh)"
  printf '%s\t%s\t%s\t%s\t%s\n' name bytes sha256 call what
  for f in "${!WHAT[@]}"; do
    [ -f "$DEST/$f" ] || { log "MISSING $f"; continue; }
    printf '%s\t%s\t%s\t%s\t%s\n' "$f" "$(stat -c %s "$DEST/$f")" "$(sha256sum "$DEST/$f" | cut -c1-64)" "${CALL[$f]}" "${WHAT[$f]}"
  done | sort -t$'\t' -k4,4n -k1,1
} >"$DEST/MANIFEST.txt"
awk -F'\t' 'NR > 2 {b[$4] += $2} END {for (c in b) printf "[make_payloads] call %s carries %d bytes of payloads\n", c, b[c]}' "$DEST/MANIFEST.txt" | sort
# One folder a call (hard links): the call carries [".devcarry/cN"] and runs with CARRY=.devcarry/cN
rm -rf "$DEST"/c[0-9]*
for f in "${!CALL[@]}"; do
  [ -f "$DEST/$f" ] || continue
  mkdir -p "$DEST/c${CALL[$f]}" && ln -f "$DEST/$f" "$DEST/c${CALL[$f]}/$f"
done
# call 4 (cold_range.sh build) unpacks the wheels' heads itself: that file again, alone
[ -f "$DEST/wheel-heads.tar.xz" ] && mkdir -p "$DEST/c4" && ln -f "$DEST/wheel-heads.tar.xz" "$DEST/c4/"
