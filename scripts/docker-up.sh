#!/usr/bin/env bash
# `make docker-up`: the system changes the Docker tests and `bisect demo --backend docker` need,
# as an explicit step a maintainer can refuse (issue 41: `make test` used to make them silently).
#
# It first prints what it would change on this machine: the apt packages it would install (as
# root), the root Docker engine it would start and with which flags, the base image it would
# build, and where it records all that. Then it asks (on a terminal), or goes ahead only with
# CONFIRM=yes (CI, `.ci/run`); anything else changes nothing and exits 1. `make docker-down`
# (scripts/docker-down.sh) undoes what this recorded: the engine it started, the images the tool
# built, the packages it installed.
#
# Network rules (DESIGN.md): the engine runs with no bridge (`--bridge=none --iptables=false`) and
# every container uses host networking, so all traffic stays on loopback. No image registry is
# reachable here, so the base image is made offline with debootstrap from the Debian mirror apt is
# already configured with, then `docker import`ed.
set -u

BASE_IMAGE="${BISECT_BASE_IMAGE:-bisect-base:bookworm}"
SUITE="${BISECT_BASE_SUITE:-bookworm}"
# python3-numpy: the demo engine (bisect_tool/demo/stack) needs it inside containers
# (`bisect demo --backend docker`); a base image made without it gets it in the derived demo image.
PACKAGES="python3,python3-numpy,gcc,libc6-dev,make,ccache"
DOCKERD_LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
PIDFILE="${DOCKERD_PIDFILE:-/var/run/bisect-dockerd.pid}"
DOCKERD_FLAGS="--bridge=none --iptables=false --ip6tables=false --exec-opt native.cgroupdriver=cgroupfs"
# What this step did, for docker-down to undo and nothing else (scripts/docker-down.sh reads it).
RECORD="${BISECT_SYSTEM_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/bisect-system}"
# The label every image the tool builds carries, its value the image's repository: docker-down
# removes an image only where the two agree (a user's image FROM one of ours inherits the label
# but not the repository).
IMAGE_LABEL="bisect.image"

say() { echo "docker-up: $*"; }
fail() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
        return 1
    fi
}

engine_up() { docker info >/dev/null 2>&1; }
image_present() { docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; }

# ---- the plan: what would change, computed, before anything changes -------------------------

need_packages=()
command -v dockerd >/dev/null || need_packages+=(docker.io)
will_start=0
engine_up || will_start=1
will_build=0
if [ "$will_start" -eq 1 ] || ! image_present; then
    will_build=1
    command -v debootstrap >/dev/null || need_packages+=(debootstrap)
fi

if [ "${#need_packages[@]}" -eq 0 ] && [ "$will_start" -eq 0 ] && [ "$will_build" -eq 0 ]; then
    say "nothing to change: the engine is up and $BASE_IMAGE is present"
    exit 0
fi

echo "docker-up will change this machine:"
if [ "${#need_packages[@]}" -gt 0 ]; then
    deps=$(apt-get -s -qq install "${need_packages[@]}" 2>/dev/null | grep -c '^Inst ' || true)
    echo "  - apt-get install ${need_packages[*]} as root (${deps:-?} packages with their" \
        "dependencies, if apt's lists are current; apt-get update runs first)"
fi
if [ "$will_start" -eq 1 ]; then
    echo "  - start a root dockerd ($DOCKERD_FLAGS, storage driver overlay2, else vfs):" \
        "no network of its own, containers use the host's loopback; log $DOCKERD_LOG; it keeps" \
        "running until make docker-down"
fi
if [ "$will_build" -eq 1 ]; then
    echo "  - build $BASE_IMAGE (about 420 MB: debootstrap $SUITE with $PACKAGES from the apt" \
        "mirror, docker import, label $IMAGE_LABEL=${BASE_IMAGE%%:*}); the tests and the demo" \
        "derive their images from it"
fi
echo "  - record what it did in $RECORD, for make docker-down to undo"

case "${CONFIRM:-}" in
    yes) ;;
    "")
        if [ -t 0 ]; then
            read -r -p "Go ahead? [y/N] " answer
            case "$answer" in y | Y | yes) ;; *) fail "nothing changed" ;; esac
        else
            fail "nothing changed; run \`make docker-up CONFIRM=yes\` to make these changes"
        fi
        ;;
    *) fail "nothing changed (CONFIRM=${CONFIRM}; CONFIRM=yes makes the changes)" ;;
esac

mkdir -p "$RECORD" || fail "cannot write the record folder $RECORD"

# ---- the changes, each recorded as it is made ------------------------------------------------

installed_now() { dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 == "ii" {print $2}' | sort; }

apt_install() {
    local before after
    before=$(installed_now)
    as_root sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $*" \
        >/tmp/docker-up-apt.log 2>&1
    local status=$?
    after=$(installed_now)
    # exactly the packages this step added (dependencies included), so that docker-down removes
    # those and no package the machine had before
    comm -13 <(echo "$before") <(echo "$after") >>"$RECORD/packages"
    return $status
}

wait_engine() {
    for _ in $(seq 1 60); do
        engine_up && return 0
        sleep 1
    done
    return 1
}

record_engine() {  # PID: the dockerd this step started, with its start time (a reused pid differs)
    local pid=$1 start
    start=$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null) || return 1
    echo "$pid $start" >"$RECORD/engine"
}

start_engine() {
    if [ "${#need_packages[@]}" -gt 0 ] && [[ " ${need_packages[*]} " == *" docker.io "* ]]; then
        say "installing docker.io from Debian"
        apt_install docker.io || fail "cannot install docker.io (see /tmp/docker-up-apt.log)"
    fi
    # Storage drivers in order of preference: overlay2 needs a kernel/filesystem that allows
    # overlay mounts (often refused inside a container); vfs always works, only costs disk.
    local driver pid
    for driver in overlay2 vfs; do
        say "starting dockerd (storage driver $driver, no bridge, no iptables); log $DOCKERD_LOG"
        # setsid: the engine must outlive this script and the shell that ran it.
        # shellcheck disable=SC2086
        # --pidfile: dockerd writes its own pid there (under sudo, $! would be sudo's)
        as_root setsid dockerd $DOCKERD_FLAGS --storage-driver="$driver" \
            --pidfile="$PIDFILE" >>"$DOCKERD_LOG" 2>&1 </dev/null &
        if wait_engine; then
            pid=$(cat "$PIDFILE" 2>/dev/null)
            record_engine "$pid" || say "could not record dockerd's pid: make docker-down will not stop it"
            say "engine up (storage driver $driver, pid $pid)"
            return 0
        fi
        pid=$(cat "$PIDFILE" 2>/dev/null) && as_root kill "$pid" 2>/dev/null
        sleep 1
    done
    fail "dockerd did not start; last lines of $DOCKERD_LOG: $(tail -n 3 "$DOCKERD_LOG" | tr '\n' ' ')"
}

# The mirror apt is configured with: deb822 .sources files first, then the one-line format.
apt_mirror() {
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk '/^URIs:/ {print $2}' "$f" | grep -v -- '-security' | grep -i debian | head -n1)
        [ -n "$uri" ] && { echo "$uri"; return; }
    done
    if [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' \
            /etc/apt/sources.list | grep -v -- '-security' | head -n1)
        [ -n "$uri" ] && { echo "$uri"; return; }
    fi
    echo "http://deb.debian.org/debian"
}

build_base_image() {
    if image_present; then
        say "base image $BASE_IMAGE already present"
        return 0
    fi
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap"
        apt_install debootstrap || fail "cannot install debootstrap (see /tmp/docker-up-apt.log)"
    fi
    local mirror start
    mirror=$(apt_mirror)
    ROOTFS_DIR=$(mktemp -d /tmp/bisect-rootfs.XXXXXX)
    local dir=$ROOTFS_DIR
    # Global, not local: the trap runs after this function has returned.
    trap 'as_root rm -rf "${ROOTFS_DIR:-}"' EXIT
    start=$(date +%s)
    say "debootstrap $SUITE from $mirror (packages $PACKAGES); log /tmp/docker-up-debootstrap.log"
    if ! as_root debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$dir" "$mirror" \
        >/tmp/docker-up-debootstrap.log 2>&1; then
        fail "debootstrap failed: $(tail -n 3 /tmp/docker-up-debootstrap.log | tr '\n' ' ')"
    fi
    # Drop the package caches: they only make the image bigger.
    as_root rm -rf "$dir/var/cache/apt/archives"/*.deb "$dir/var/lib/apt/lists"/*
    if ! as_root tar -C "$dir" -c . | docker import --change "LABEL $IMAGE_LABEL=${BASE_IMAGE%%:*}" \
        - "$BASE_IMAGE" >/dev/null; then
        fail "docker import of $BASE_IMAGE failed"
    fi
    say "built $BASE_IMAGE in $(($(date +%s) - start)) s"
}

if engine_up; then
    say "engine already running (not ours: make docker-down leaves it running)"
else
    start_engine
fi
build_base_image
say "done; make docker-down undoes it (record: $RECORD)"
exit 0
