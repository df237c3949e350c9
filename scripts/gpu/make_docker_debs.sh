#!/usr/bin/env bash
# Make .devcarry/docker-debs.tar.xz here: the Docker engine for the lent H200 (issue 17) as .deb
# files from the Debian mirror apt is configured with, trimmed to what `dockerd --bridge=none
# --iptables=false` needs, so it fits beside the pinned stack in two device calls.
#
# Why trimmed: the untouched debs are 65 MB (docker.io alone 36 MB: the docker CLI, dnet,
# ovrouter, docker-proxy ride along), and a fresh device needs the stack (50.3 MB) and
# 0.26.0's extension (55.9 MB) too, in calls of 64 MiB. Kept: dockerd; containerd and
# containerd-shim-runc-v2; runc; and, as shipped, libdevmapper1.02.1 (dockerd links it; the
# device image may lack it) and fuse-overlayfs + libfuse3-3 (a storage driver to try where
# overlay2 is refused). Left out:
# the docker CLI (scripts/gpu/docker_setup.sh talks to the engine through the docker SDK that
# `bisect` itself uses), ctr, the v1 shims, tini/docker-init (only for `--init`), and every
# maintainer script and systemd/init file (no systemd there; postinst would run adduser).
# Each repacked deb keeps its package name, version and Depends (dpkg --force-depends there:
# iptables, adduser, lsb-base and tini are not needed with --iptables=false and no --init).
#
# The repacked debs are stored uncompressed inside one solid xz stream (BCJ x86 filter,
# 192 MiB dictionary): dockerd, containerd and the shim share most of their Go code.
# Output: .devcarry/docker-debs.tar.xz (26.4 MB); with PART1_BYTES=N also byte splits of it.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${WORK:-/tmp/bisect-docker-debs}
OUTDIR=$ROOT/.devcarry
PART1_BYTES=${PART1_BYTES:-0}  # >0: also write .part1 (that many bytes) and .part2
rm -rf "$WORK" && mkdir -p "$WORK/dl" "$WORK/out" "$OUTDIR"
cd "$WORK/dl"
apt-get download docker.io containerd runc libdevmapper1.02.1 fuse-overlayfs libfuse3-3 \
  2> >(grep -v '^W: Download is performed unsandboxed' >&2)

repack() {  # DEB KEEP-PATH...
  local deb=$1; shift
  local t=$WORK/t
  rm -rf "$t" && mkdir -p "$t/DEBIAN"
  dpkg-deb -e "$deb" "$t/ctl"
  dpkg-deb -x "$deb" "$t/all"
  cp "$t/ctl/control" "$t/DEBIAN/control"
  sed -i -e '/^Installed-Size:/d' "$t/DEBIAN/control"
  local p
  for p in "$@"; do
    mkdir -p "$t/pkg/$(dirname "$p")"
    cp -a "$t/all/$p" "$t/pkg/$p"
  done
  mv "$t/DEBIAN" "$t/pkg/DEBIAN"
  dpkg-deb --root-owner-group -Znone -b "$t/pkg" "$WORK/out/$(basename "$deb")" >/dev/null
  rm -rf "$t"
}
repack docker.io_*.deb usr/sbin/dockerd
repack containerd_*.deb usr/bin/containerd usr/bin/containerd-shim-runc-v2
repack runc_*.deb usr/sbin/runc
# Small, and their maintainer scripts are only ldconfig triggers: carried as Debian ships them.
cp libdevmapper1.02.1_*.deb fuse-overlayfs_*.deb libfuse3-3_*.deb "$WORK/out/"
(cd "$WORK/out" && sha256sum ./*.deb >SHA256SUMS && ls -l)
tar -C "$WORK/out" --sort=name --owner=0 --group=0 -cf - . \
  | xz --x86 --lzma2=preset=9e,dict=192MiB -T1 >"$OUTDIR/docker-debs.tar.xz"
rm -f "$OUTDIR"/docker-debs.tar.xz.part*
if ((PART1_BYTES > 0)); then  # byte splits, for a plan that spreads the engine over two calls
  head -c "$PART1_BYTES" "$OUTDIR/docker-debs.tar.xz" >"$OUTDIR/docker-debs.tar.xz.part1"
  tail -c +"$((PART1_BYTES + 1))" "$OUTDIR/docker-debs.tar.xz" >"$OUTDIR/docker-debs.tar.xz.part2"
fi
sha256sum "$OUTDIR/docker-debs.tar.xz" | cut -d' ' -f1 >"$OUTDIR/docker-debs.sha256"
cp "$OUTDIR/docker-debs.sha256" "$HERE/docker-debs.sha256"
ls -l "$OUTDIR"/docker-debs*
