#!/usr/bin/env bash
# The Docker engine on the lent H200 (issue 17): install the carried debs, start dockerd with a
# storage driver that works there, build the pinned image offline, check CUDA inside it.
#
# Runs ON THE GPU MACHINE from the repo root, as root, after setup_stack.sh put the stack in
# /tmp/dev. Idempotent: each step is skipped when done (a warm machine keeps /tmp/dev, the
# installed binaries and a running dockerd).
#
#   docker_setup.sh --stash   call 1: only keep the carried part(s) of the engine in /tmp/dev
#   docker_setup.sh           call 2: the rest (needs both parts, and the stack with so26)
#
# .devcarry/docker-debs.tar.xz (or its .part1/.part2 byte splits, one per call: see
# docs/gpu-runbook.md) is made by scripts/gpu/make_docker_debs.sh; its sha256 is checked
# against scripts/gpu/docker-debs.sha256 once reassembled.
# Prints [docker_setup] markers; on a failure the exact error, then the next option; exit 0
# when the image is built and torch sees the GPU in a container, 2 if no engine could start.
set -uo pipefail
DEV=${DEV:-/tmp/dev}
CARRY=${CARRY:-.devcarry}
OUT=${OUT:-$DEV/out}
TAG=${TAG:-bisect-pinned:0.26.0}
PYTHON=${PYTHON:-$(command -v python3)}
STASH=0
[[ ${1:-} == --stash ]] && STASH=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
ENGINE=$DEV/engine
DATA=${DOCKER_DATA:-/var/lib/bisect-docker}
DLOG=$OUT/dockerd.log
mkdir -p "$ENGINE" "$OUT"
# The docker SDK (the tool's own client; no docker CLI is carried) lives in the carried deps.
export PYTHONPATH=$ROOT:$DEV/deps${PYTHONPATH:+:$PYTHONPATH}
log() { echo "[docker_setup $(date +%T)] $*"; }
T0=$SECONDS

# 1. The engine archive: parts stashed in /tmp/dev (they arrive in different calls).
for p in part1 part2; do
  if [[ -f $CARRY/docker-debs.tar.xz.$p ]]; then
    cp -f "$CARRY/docker-debs.tar.xz.$p" "$ENGINE/"
    log "stashed docker-debs.tar.xz.$p ($(stat -c %s "$ENGINE/docker-debs.tar.xz.$p") bytes)"
  fi
done
[[ -f $CARRY/docker-debs.tar.xz ]] && cp -f "$CARRY/docker-debs.tar.xz" "$ENGINE/"
((STASH)) && exit 0
if [[ ! -f $ENGINE/debs/.ok ]]; then
  if [[ ! -f $ENGINE/docker-debs.tar.xz ]]; then
    if [[ -f $ENGINE/docker-debs.tar.xz.part1 && -f $ENGINE/docker-debs.tar.xz.part2 ]]; then
      cat "$ENGINE/docker-debs.tar.xz.part1" "$ENGINE/docker-debs.tar.xz.part2" \
        >"$ENGINE/docker-debs.tar.xz"
    else
      log "FAIL: engine archive incomplete in $ENGINE: $(ls "$ENGINE" | tr '\n' ' ')"
      log "carry .devcarry/docker-debs.tar.xz.part1 in call 1 and .part2 in call 2"
      exit 2
    fi
  fi
  want=$(cat "$HERE/docker-debs.sha256")
  got=$(sha256sum "$ENGINE/docker-debs.tar.xz" | cut -d' ' -f1)
  if [[ $got != "$want" ]]; then
    log "FAIL: docker-debs.tar.xz sha256 $got, expected $want (a part is missing or stale)"
    rm -f "$ENGINE/docker-debs.tar.xz"
    exit 2
  fi
  rm -rf "$ENGINE/debs" && mkdir -p "$ENGINE/debs"
  if command -v xz >/dev/null; then
    xz -dc -T0 "$ENGINE/docker-debs.tar.xz" | tar -x -C "$ENGINE/debs"
  else
    "$PYTHON" -c 'import sys,tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="tar")' \
      "$ENGINE/docker-debs.tar.xz" "$ENGINE/debs"
  fi
  (cd "$ENGINE/debs" && sha256sum -c --quiet SHA256SUMS) || { log "FAIL: deb checksums"; exit 2; }
  touch "$ENGINE/debs/.ok"
  log "debs: $(ls "$ENGINE/debs"/*.deb | xargs -n1 basename | tr '\n' ' ')"
fi

# 2. Install with dpkg. --force-depends: docker.io's Depends (iptables, adduser, lsb-base, tini)
# are not needed for `dockerd --bridge=none --iptables=false` without --init, and the device has
# no apt repository to satisfy them; libdevmapper1.02.1's dmsetup only serves LVM tools. The
# libraries go in only where the image lacks the soname (never downgrade Ubuntu's own).
install_deb() {  # DEB
  local out
  if ! out=$(dpkg -i --force-depends --force-confold "$1" 2>&1); then
    log "dpkg -i $(basename "$1") failed:"; echo "$out" | tail -n 15
    return 1
  fi
  echo "$out" | grep -iE 'warning|error' | head -n 5
}
if ! command -v dockerd >/dev/null || ! command -v containerd >/dev/null || ! command -v runc >/dev/null; then
  ldconfig -p | grep -q 'libdevmapper.so.1.02.1 ' || install_deb "$ENGINE"/debs/libdevmapper1.02.1_*.deb
  ldconfig -p | grep -q 'libfuse3.so.3 ' || install_deb "$ENGINE"/debs/libfuse3-3_*.deb
  for d in runc containerd docker.io fuse-overlayfs; do
    install_deb "$ENGINE"/debs/${d}_*.deb || log "continuing without $d"
  done
  ldconfig
fi
for b in dockerd containerd containerd-shim-runc-v2 runc; do
  if p=$(command -v $b); then
    log "$b: $p $($b --version 2>&1 | head -n1)"
    missing=$(ldd "$p" 2>&1 | grep 'not found')
    [[ -n $missing ]] && log "FAIL: $b misses libraries: $missing"
  else
    log "FAIL: $b not installed"
  fi
done
log "kernel $(uname -r); cgroup $(stat -fc %T /sys/fs/cgroup); / on $(stat -fc %T /);" \
  "overlay module: $(grep -c overlay /proc/filesystems) fuse: $([[ -e /dev/fuse ]] && echo yes || echo no)"

# 3. dockerd: overlay2 on disk, overlay2 on a tmpfs (overlay over an overlay root is refused),
# fuse-overlayfs, vfs (always works; copies the whole image per container: slow, last).
engine_up() { "$PYTHON" -c 'import docker,sys; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }
driver_now() { "$PYTHON" -c 'import docker; print(docker.from_env(timeout=5).info()["Driver"])'; }
start_dockerd() {  # DRIVER DATA_ROOT
  log "starting dockerd --storage-driver=$1 --data-root=$2 (log $DLOG)"
  mkdir -p "$2"
  echo "=== dockerd --storage-driver=$1 --data-root=$2" >>"$DLOG"
  setsid dockerd --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    --storage-driver="$1" --data-root="$2" --exec-opt native.cgroupdriver=cgroupfs \
    --host=unix:///var/run/docker.sock --pidfile=/var/run/bisect-dockerd.pid \
    >>"$DLOG" 2>&1 </dev/null &
  local pid=$! i
  for i in $(seq 1 40); do
    if engine_up; then log "engine up in ${i}x0.5 s, driver $(driver_now)"; return 0; fi
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  log "dockerd ($1) did not come up; its log says:"
  sed -n '/=== dockerd --storage-driver='"$1"'/,$p' "$DLOG" | grep -E 'level=(error|fatal|warning)|failed|Error' | tail -n 8
  kill "$pid" 2>/dev/null; sleep 1; kill -9 "$pid" 2>/dev/null
  stop_containerd_of "$2"
  return 1
}
stop_containerd_of() {  # the containerd this dockerd started (by its pid file), nothing else
  local f=/var/run/docker/containerd/containerd.pid
  [[ -f $f ]] && kill "$(cat "$f")" 2>/dev/null
  rm -f /var/run/docker.sock /var/run/bisect-dockerd.pid
}
if engine_up; then
  log "engine already running (driver $(driver_now))"
else
  started=0
  if start_dockerd overlay2 "$DATA"; then started=1
  else
    mkdir -p /mnt/bisect-docker
    if mountpoint -q /mnt/bisect-docker || mount -t tmpfs -o size=64g,mode=711 tmpfs /mnt/bisect-docker; then
      start_dockerd overlay2 /mnt/bisect-docker/data && started=1
    else
      log "cannot mount a tmpfs for overlay2 (above)"
    fi
    if ((!started)) && command -v fuse-overlayfs >/dev/null && [[ -e /dev/fuse ]]; then
      start_dockerd fuse-overlayfs "$DATA-fuse" && started=1
    fi
    ((started)) || { start_dockerd vfs "$DATA-vfs" && started=1 && log "WARNING: vfs copies the image for every container"; }
  fi
  if ((!started)); then
    log "BLOCKED: no storage driver let dockerd start. Next option: containerd alone"
    timeout 10 containerd --root "$DATA-ctd" --state /run/bisect-containerd \
      --address /run/bisect-containerd.sock >"$OUT/containerd-alone.log" 2>&1
    log "containerd alone exited $? after at most 10 s; its log tail:"; tail -n 8 "$OUT/containerd-alone.log"
    log "ctr/nerdctl and podman were not carried (64 MiB calls: docs/gpu-runbook.md): stopping here"
    exit 2
  fi
fi
"$PYTHON" -c 'import docker,json; i=docker.from_env().info(); print(json.dumps({k: i.get(k) for k in ("ServerVersion","Driver","DriverStatus","CgroupDriver","CgroupVersion","Runtimes","DockerRootDir","SecurityOptions")}, indent=1))' \
  | tee "$OUT/docker-info.json"

# 4. The pinned image, made here from the stack the local backend uses.
if "$PYTHON" -c 'import docker,sys; docker.from_env().images.get(sys.argv[1])' "$TAG" 2>/dev/null; then
  log "image $TAG present"
else
  [[ -f $DEV/site/vllm/_C_stable_libtorch.abi3.so ]] || { log "FAIL: the pinned _C_stable_libtorch is not in $DEV/site (carry so26.xz, run setup_stack.sh)"; exit 1; }
  log "building $TAG (python $PYTHON)"
  "$PYTHON" "$HERE/docker_image.py" build --tag "$TAG" --python "$PYTHON" \
    --pinned "$DEV/site" --pinned "$DEV/deps" || { log "FAIL: image build"; exit 1; }
fi

# 5. CUDA inside, with the GPU access the backend gives a lifetime (docker_gpu = "devices").
if "$PYTHON" "$HERE/docker_image.py" check --tag "$TAG" --check cuda --gpu 0 --json "$OUT/docker-cuda.json"; then
  log "OK: torch sees the GPU in a container of $TAG ($((SECONDS - T0)) s in this script)"
else
  log "FAIL: CUDA check in the container (above); trying the image with every package (--full)"
  "$PYTHON" -c 'import docker,sys; docker.from_env().images.remove(sys.argv[1], force=True)' "$TAG"
  "$PYTHON" "$HERE/docker_image.py" build --full --tag "$TAG" --python "$PYTHON" \
    --pinned "$DEV/site" --pinned "$DEV/deps" || exit 1
  "$PYTHON" "$HERE/docker_image.py" check --tag "$TAG" --check cuda --gpu 0 --json "$OUT/docker-cuda.json" || exit 1
  log "OK with --full ($((SECONDS - T0)) s)"
fi
