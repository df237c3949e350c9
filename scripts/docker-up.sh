#!/usr/bin/env bash
# Start the Docker engine and build the offline base image, where this machine allows it.
#
# Idempotent and best effort: every step is skipped when already done, and the script always
# exits 0, printing why it stopped; the Docker tests then skip with the reason (tests/conftest.py).
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

say() { echo "docker-up: $*"; }
give_up() { say "$*"; exit 0; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
        return 1
    fi
}

apt_install() {
    as_root sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $*" \
        >/tmp/docker-up-apt.log 2>&1
}

engine_up() { docker info >/dev/null 2>&1; }

wait_engine() {
    for _ in $(seq 1 60); do
        engine_up && return 0
        sleep 1
    done
    return 1
}

start_engine() {
    if ! command -v dockerd >/dev/null; then
        say "dockerd missing: installing docker.io from Debian"
        apt_install docker.io || give_up "cannot install docker.io (see /tmp/docker-up-apt.log)"
    fi
    # Storage drivers in order of preference: overlay2 needs a kernel/filesystem that allows
    # overlay mounts (often refused inside a container); vfs always works, only costs disk.
    local driver
    for driver in overlay2 vfs; do
        say "starting dockerd (storage driver $driver, no bridge, no iptables); log $DOCKERD_LOG"
        # setsid: the engine must outlive this script and the shell that ran it.
        as_root setsid dockerd --bridge=none --iptables=false --ip6tables=false \
            --storage-driver="$driver" --exec-opt native.cgroupdriver=cgroupfs \
            >>"$DOCKERD_LOG" 2>&1 </dev/null &
        local pid=$!
        if wait_engine; then
            say "engine up (storage driver $driver)"
            return 0
        fi
        kill "$pid" 2>/dev/null
        sleep 1
    done
    give_up "dockerd did not start; last lines of $DOCKERD_LOG: $(tail -n 3 "$DOCKERD_LOG" | tr '\n' ' ')"
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
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base image $BASE_IMAGE already present"
        return 0
    fi
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap"
        apt_install debootstrap || give_up "cannot install debootstrap (see /tmp/docker-up-apt.log)"
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
        give_up "debootstrap failed: $(tail -n 3 /tmp/docker-up-debootstrap.log | tr '\n' ' ')"
    fi
    # Drop the package caches: they only make the image bigger.
    as_root rm -rf "$dir/var/cache/apt/archives"/*.deb "$dir/var/lib/apt/lists"/*
    if ! as_root tar -C "$dir" -c . | docker import - "$BASE_IMAGE" >/dev/null; then
        give_up "docker import of $BASE_IMAGE failed"
    fi
    say "built $BASE_IMAGE in $(($(date +%s) - start)) s"
}

if engine_up; then
    say "engine already running"
else
    start_engine
fi
build_base_image
exit 0
