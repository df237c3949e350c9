#!/usr/bin/env bash
# Issue 17 on the lent H200: one candidate's lifetimes through `--backend docker` (containers of
# the image docker_setup.sh built, GPU by [runtime] docker_gpu = "devices"), and one lifetime of
# the local backend in the same run for the boot-time comparison.
#
# Runs ON THE GPU MACHINE from the repo root in call 2 of docs/gpu-runbook.md ("Docker on the
# H200"): after setup_stack.sh (site, deps, fa3, so26 in /tmp/dev). Bounded: every step has a
# timeout and the whole script stops before DEADLINE_S (default 540 s) from its start.
# Writes into $OUT: docker-info.json, docker-cuda.json, probe-docker.json, probe-local.json,
# boot-times.json, and extras.tgz (docker-setup.log, dockerd.log, the probes' stderr, lifetime
# logs); with the caller's call3.log that is 7 files (8 come back at most).
# Expected: probe-docker DIVERGENT (exit 1) in 3 lifetimes, as the local backend gave.
set -uo pipefail
DEV=${DEV:-/tmp/dev}
OUT=${OUT:-$DEV/out}
LIFETIMES=${LIFETIMES:-3}
DEADLINE_S=${DEADLINE_S:-540}
TAG=${TAG:-bisect-pinned:0.26.0}
PYTHON=$(command -v python3)
mkdir -p "$OUT/logs"
T0=$SECONDS
# At most 8 files come back: the small summaries stay, the rest go into one archive at exit.
bundle() {
  (cd "$OUT" && tar -czf extras.tgz --ignore-failed-read dockerd.log docker-setup.log \
    probe-docker.err probe-local.err containerd-alone.log logs 2>/dev/null
   rm -rf dockerd.log docker-setup.log probe-docker.err probe-local.err containerd-alone.log logs)
  ls -l "$OUT"
}
trap bundle EXIT
step() { echo; echo "[docker_probe $(date +%T) +$((SECONDS - T0))s] == $*"; }
left() { echo $((DEADLINE_S - (SECONDS - T0))); }
export PYTHONUNBUFFERED=1
export BISECT_CACHE_DIR=$DEV/cache
export PYTHONPATH=$PWD:$DEV/site:$DEV/deps
export VLLM_USE_FLASHINFER_SAMPLER=0

step "stack (setup_stack.sh --verify none)"
timeout 120 bash scripts/gpu/setup_stack.sh --verify none || { echo "stack incomplete"; exit 3; }
[[ -f $DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so.ok ]] || { echo "so26 missing"; exit 3; }

step "random checkpoint"
if [[ ! -f $DEV/qwen3-rand/.ok ]]; then
  timeout 120 "$PYTHON" -m bisect_tool model random --config scripts/gpu/qwen3-0.6b/config.json \
    --out "$DEV/qwen3-rand" --dtype float16 --seed 0 && touch "$DEV/qwen3-rand/.ok" || exit 3
fi

step "engine and image (docker_setup.sh)"
timeout $(( $(left) - 200 )) bash scripts/gpu/docker_setup.sh 2>&1 | tee "$OUT/docker-setup.log"
rc=${PIPESTATUS[0]}
if ((rc != 0)); then echo "docker_setup.sh exited $rc: see above"; exit "$rc"; fi

step "stand-in release repository and the candidate's artifact"
R=$DEV/releases
if [[ ! -d $R/.git ]]; then
  git init -q "$R" && mkdir -p "$R/csrc"
  for v in 0.26.0 0.27.0; do
    echo "$v" >"$R/csrc/VERSION"
    git -C "$R" add -A
    git -C "$R" -c user.email=bisect@localhost -c user.name=bisect commit -qm "[Release] vLLM v$v"
    git -C "$R" tag "v$v"
  done
fi
"$PYTHON" -m bisect_tool artifacts import --repo "$R" --commit v0.26.0 \
  "$DEV/0.26.0/vllm/_C_stable_libtorch.abi3.so" || exit 3

# The bundled recipe with this machine's settings: the docker one runs the image built above
# with the driver passed without the toolkit; the local one is run_e2e.sh's.
mk_recipe() {  # BACKEND-LINES OUTFILE
  sed -e "s|^backend = \"local\"|$1|" \
      -e "s|^VLLM_BATCH_INVARIANT = \"1\"|VLLM_BATCH_INVARIANT = \"1\"\nVLLM_USE_FLASHINFER_SAMPLER = \"0\"|" \
      -e "s|^weights = \"random:models/qwen3-0.6b\"|weights = \"$DEV/qwen3-rand\"|" \
      bisect_tool/recipes/batch-invariance.toml >"$2"
}
mk_recipe "backend = \"docker\"\nimage = \"$TAG\"\npython = \"python3\"\ndocker_gpu = \"devices\"\ngpus = [\"0\"]\nshm_size = \"16g\"\nboot_timeout_s = 240.0" "$DEV/bi-docker.toml"
mk_recipe "backend = \"local\"\npinned_package_dir = \"$DEV/site\"\npython = \"python3\"\nboot_timeout_s = 240.0" "$DEV/bi-local.toml"
grep -A9 '^\[runtime\]' "$DEV/bi-docker.toml" | head -n 9

step "bisect probe --commit v0.26.0 --lifetimes $LIFETIMES, docker backend ($(left) s left)"
rm -rf "$DEV/state-docker"
timeout --signal=TERM $(( $(left) - 75 )) "$PYTHON" -m bisect_tool probe --commit v0.26.0 \
  --lifetimes "$LIFETIMES" --recipe "$DEV/bi-docker.toml" --repo "$R" \
  --state-dir "$DEV/state-docker" --json >"$OUT/probe-docker.json" 2>"$OUT/probe-docker.err"
echo "docker probe exit $? (1 = DIVERGENT)"; tail -n 15 "$OUT/probe-docker.err"
cp "$DEV"/state-docker/logs/*.log "$OUT/logs/" 2>/dev/null
"$PYTHON" -c 'import docker; print("containers left:", [c.name for c in docker.from_env().containers.list(all=True, filters={"label": "bisect.tool=bisect"})])'

step "one lifetime of the local backend for the boot time ($(left) s left)"
if (( $(left) > 70 )); then
  rm -rf "$DEV/state-local"
  timeout --signal=TERM $(( $(left) - 5 )) "$PYTHON" -m bisect_tool probe --commit v0.26.0 \
    --lifetimes 1 --recipe "$DEV/bi-local.toml" --repo "$R" --state-dir "$DEV/state-local" \
    --json >"$OUT/probe-local.json" 2>"$OUT/probe-local.err"
  echo "local probe exit $?"; tail -n 5 "$OUT/probe-local.err"
else
  echo "skipped: too little time left"
fi

step "boot times"
"$PYTHON" - "$OUT" <<'EOF' | tee "$OUT/boot-times.json"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def find(d, key):
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            r = find(v, key)
            if r is not None:
                return r
    if isinstance(d, list):
        for v in d:
            r = find(v, key)
            if r is not None:
                return r
    return None
res = {}
for name in ("docker", "local"):
    try:
        d = json.loads((out / f"probe-{name}.json").read_text())
    except (OSError, ValueError) as exc:
        res[name] = {"error": str(exc)}
        continue
    res[name] = {"verdict": d.get("verdict"), "lifetimes": [
        {"id": l["lifetime_id"], "verdict": l["verdict"], "boot_s": find(l.get("detail"), "boot_s"),
         "probe_s": find(l.get("detail"), "probe_s"), "duration_s": l.get("duration_s")}
        for l in d.get("lifetimes", [])]}
print(json.dumps(res, indent=1))
EOF
echo "[docker_probe] done in $((SECONDS - T0)) s"
