#!/usr/bin/env bash
# Issue 8 on the lent H200: `bisect start --good v0.27.0 --bad v0.26.0 --recipe batch-invariance`
# with the local backend, the pinned stack being vLLM 0.26.0's Python side, the two releases'
# `_C_stable_libtorch.abi3.so` imported into the tool's cache from files (the machine cannot
# download), a random Qwen3-0.6B-shaped checkpoint, the controls, and the report.
#
# Runs ON THE GPU MACHINE from the repo root after setup_stack.sh has unpacked the stack into
# /tmp/dev (see docs/gpu-runbook.md). The machine has no vLLM clone, so the range lives in a
# stand-in repository with one commit per release, tagged v0.26.0 and v0.27.0, each touching
# csrc/ (a release-level bisect: the candidates are releases, their artifacts the release wheels').
set -euo pipefail
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
mkdir -p "$OUT"
export BISECT_CACHE_DIR=$DEV/cache
export PYTHONPATH=$PWD:$DEV/tool:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0
R=$DEV/releases
rm -rf "$R" "$DEV/state"
git init -q "$R"
mkdir -p "$R/csrc"
for v in 0.26.0 0.27.0; do
  echo "$v" > "$R/csrc/VERSION"
  git -C "$R" add -A
  git -C "$R" -c user.email=bisect@localhost -c user.name=bisect commit -qm "[Release] vLLM v$v"
  git -C "$R" tag "v$v"
done
for v in 0.26.0 0.27.0; do
  python3 -m bisect_tool artifacts import --repo "$R" --commit "v$v" \
    "$DEV/$v/vllm/_C_stable_libtorch.abi3.so"
done
python3 -m bisect_tool artifacts ls
# The bundled recipe plus what this machine needs: where the pinned stack lives, and the
# FlashInfer sampler off (its wheels were left out of the stack; vllm-facts.md).
sed -e "s|^backend = \"local\"|backend = \"local\"\npinned_package_dir = \"$DEV/site\"\npython = \"python3\"|" \
    -e "s|^VLLM_BATCH_INVARIANT = \"1\"|VLLM_BATCH_INVARIANT = \"1\"\nVLLM_USE_FLASHINFER_SAMPLER = \"0\"|" \
    -e "s|^weights = \"random:models/qwen3-0.6b\"|weights = \"random:$PWD/bisect_tool/recipes/models/qwen3-0.6b\"|" \
    bisect_tool/recipes/batch-invariance.toml > "$DEV/batch-invariance-h200.toml"
set +e
timeout --signal=TERM "${E2E_TIMEOUT:-520}" python3 -m bisect_tool start --good v0.27.0 --bad v0.26.0 --recipe "$DEV/batch-invariance-h200.toml" \
  --repo "$R" --state-dir "$DEV/state" 2>&1 | tee "$OUT/start.log"
rc=${PIPESTATUS[0]}
set -e
python3 -m bisect_tool status --json --repo "$R" --state-dir "$DEV/state" > "$OUT/status.json" || true
python3 -m bisect_tool report --repo "$R" --state-dir "$DEV/state" --plot "$OUT/posterior.png" \
  -o "$OUT/report.md" || true
python3 -m bisect_tool report --format json --repo "$R" --state-dir "$DEV/state" -o "$OUT/report.json" || true
cp "$DEV/state/journal.jsonl" "$OUT/" || true
mkdir -p "$OUT/logs" && cp "$DEV"/state/logs/*.log "$OUT/logs/" 2>/dev/null || true
exit "$rc"
