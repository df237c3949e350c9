#!/usr/bin/env bash
# The focused RMSNorm op check (issue 5) on one vLLM release's _C_stable_libtorch, both modes.
#
# Runs ON THE GPU MACHINE, from the repo root. Needs only the image's python3 (torch, click,
# numpy): `python -m bisect_tool.probes` imports no gitpython/docker/tenacity, and the op check
# loads the .so straight into torch (no vLLM Python side needed).
#
# Usage: scripts/gpu/op_probe.sh VERSION [PAYLOAD.xz]
#   e.g. scripts/gpu/op_probe.sh 0.26.0 .devcarry/so26.xz
# Unpacks PAYLOAD.xz into /tmp/dev/VERSION/vllm/_C_stable_libtorch.abi3.so (hash-checked by
# setup_stack.sh's table) unless it is already there, then runs the probe with
# VLLM_BATCH_INVARIANT=1 and without it. Writes $OUT/op-VERSION.json (both results) and prints
# one verdict line per mode. Exit 0 when both probes ran (whatever they found), 3 otherwise.
#
# Expected (vLLM issue 51187, fix PR #48391): 0.26.0 DIVERGENT in both modes (the RMSNorm
# launcher picks its block size by num_tokens < 256, batch-invariant or not); 0.27.0 CLEAN with
# VLLM_BATCH_INVARIANT=1; default mode may differ either way (not a batch-invariance promise).
set -uo pipefail

VERSION=${1:?usage: op_probe.sh VERSION [PAYLOAD.xz]}
PAYLOAD=${2:-}
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-/tmp/dev/out}
mkdir -p "$OUT"
SO=$DEV/$VERSION/vllm/_C_stable_libtorch.abi3.so

if [[ ! -f $SO.ok ]]; then
  if [[ -z $PAYLOAD || ! -f $PAYLOAD ]]; then
    echo "op_probe: $SO is not unpacked and no payload given; carry .devcarry/soNN.xz" >&2
    exit 3
  fi
  # setup_stack.sh unpacks and hash-checks every carried .so (--only-so: not the stack).
  bash "$(dirname "${BASH_SOURCE[0]}")/setup_stack.sh" --only-so || exit 3
  if [[ ! -f $SO.ok ]]; then
    echo "op_probe: $PAYLOAD did not unpack to $SO (see setup_stack.sh output)" >&2
    exit 3
  fi
fi

run_mode() {  # NAME [--env K=V]
  local name=$1; shift
  local t0=$SECONDS
  PYTHONUNBUFFERED=1 python3 -m bisect_tool.probes --recipe batch-invariance-op \
    --extension "$SO" "$@" --json >"$OUT/.op-$VERSION-$name.json" 2>"$OUT/.op-$VERSION-$name.err"
  local rc=$?
  local verdict
  verdict=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["verdict"].upper()+": "+d["message"])' \
    "$OUT/.op-$VERSION-$name.json" 2>/dev/null || echo "NO RESULT: $(tail -3 "$OUT/.op-$VERSION-$name.err")")
  echo "op $VERSION $name: exit $rc in $((SECONDS - t0)) s; $verdict"
  return $rc
}

run_mode batch-invariant --env VLLM_BATCH_INVARIANT=1; rc_bi=$?
run_mode default; rc_def=$?

# One file per version ($OUT comes back as at most 8 files per call).
python3 - "$OUT" "$VERSION" <<'EOF'
import json, pathlib, sys
out, version = pathlib.Path(sys.argv[1]), sys.argv[2]
result = {"version": version}
for name in ("batch-invariant", "default"):
    f = out / f".op-{version}-{name}.json"
    try:
        result[name] = json.loads(f.read_text())
    except (OSError, ValueError):
        result[name] = {"verdict": "missing",
                        "stderr": (out / f".op-{version}-{name}.err").read_text()[-4000:]}
    for suffix in (".json", ".err"):
        (out / f".op-{version}-{name}{suffix}").unlink(missing_ok=True)
(out / f"op-{version}.json").write_text(json.dumps(result, indent=2))
EOF

# 0 CLEAN / 1 DIVERGENT are results; 2 INCONCLUSIVE / 3 UNTESTABLE mean the check did not run.
if ((rc_bi <= 1 && rc_def <= 1)); then exit 0; fi
exit 3
