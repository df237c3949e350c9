#!/usr/bin/env bash
# `make docker-down`: undoes `make docker-up` (scripts/docker-up.sh), removing only what it can
# prove is the tool's own, and saying what it keeps and why:
#   - the images the tool built: an image goes only where its repository is one of the tool's
#     (BISECT_IMAGE_REPOS) and its label bisect.image names that same repository (docker-up,
#     the demo, Dockerfile.base's builder and the tests' pinned image set it); a user's image
#     built FROM one of ours inherits the label but not the repository, and is kept;
#   - the Docker engine docker-up started: the pid it recorded, only while /proc still shows
#     dockerd there with the start time it recorded (a reused pid is left alone); an engine
#     docker-up found running is never stopped;
#   - the apt packages docker-up installed: exactly those it recorded (dependencies included),
#     those still installed.
# Like docker-up it prints the plan first, then asks (on a terminal) or acts only with
# CONFIRM=yes; anything else changes nothing and exits 1.
set -u

RECORD="${BISECT_SYSTEM_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/bisect-system}"
IMAGE_LABEL="bisect.image"
# The base image last: the others are derived from it.
REPOS="${BISECT_IMAGE_REPOS:-bisect-demo-stack bisect-test-pinned bisect-builder bisect-base}"

say() { echo "docker-down: $*"; }
fail() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
        return 1
    fi
}

# ---- the plan -------------------------------------------------------------------------------

remove_images=()
keep_images=()
remove_containers=()
keep_containers=()
if docker info >/dev/null 2>&1; then
    # the containers the tool started (label bisect.tool=bisect) and that no longer run, left by
    # a crashed run or an interrupted test: they hold their images, which `docker rmi` then
    # refuses (CI, 2026-12-07). A running one is a live run's: kept, and named
    while read -r id image state session; do
        [ -n "$id" ] || continue
        if [ "$state" = running ] || [ "$state" = restarting ] || [ "$state" = paused ]; then
            keep_containers+=("$id ($image, session ${session:-?}: $state; \`bisect reset\` in that run's clone ends it)")
        else
            remove_containers+=("$id ($image, session ${session:-?})")
        fi
    done < <(docker ps -a --filter "label=bisect.tool=bisect" \
        --format '{{.ID}} {{.Image}} {{.State}} {{.Label "bisect.session"}}' 2>/dev/null)
    for repo in $REPOS; do
        while read -r ref id; do
            [ -n "$ref" ] || continue
            label=$(docker image inspect --format "{{index .Config.Labels \"$IMAGE_LABEL\"}}" \
                "$id" 2>/dev/null)
            if [ "$label" = "$repo" ]; then
                remove_images+=("$ref")
            else
                keep_images+=("$ref (label $IMAGE_LABEL=${label:-none}, not $repo: not proven ours)")
            fi
        done < <(docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' "$repo" 2>/dev/null)
    done
    engine_note=""
else
    engine_note="no Docker engine answers: no image to look at"
fi

engine_pid=""
if [ -f "$RECORD/engine" ]; then
    read -r pid start <"$RECORD/engine"
    now=$(awk '{print $22}' "/proc/$pid/stat" 2>/dev/null)
    comm=$(cat "/proc/$pid/comm" 2>/dev/null)
    if [ -n "$now" ] && [ "$now" = "$start" ] && [ "$comm" = dockerd ]; then
        engine_pid=$pid
    else
        engine_gone="the dockerd docker-up started (pid $pid) is gone, or its pid is another process's now"
    fi
fi

remove_packages=()
if [ -s "$RECORD/packages" ]; then
    while read -r pkg; do
        [ -n "$pkg" ] || continue
        if dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null | grep -q '^ii'; then
            remove_packages+=("$pkg")
        fi
    done < <(sort -u "$RECORD/packages")
fi

if [ "${#remove_images[@]}" -eq 0 ] && [ "${#remove_containers[@]}" -eq 0 ] && [ -z "$engine_pid" ] \
    && [ "${#remove_packages[@]}" -eq 0 ]; then
    say "nothing to undo${engine_note:+ ($engine_note)}"
    [ "${#keep_images[@]}" -gt 0 ] && printf '  kept: %s\n' "${keep_images[@]}"
    [ "${#keep_containers[@]}" -gt 0 ] && printf '  kept: the running container %s\n' "${keep_containers[@]}"
    [ -n "${engine_gone:-}" ] && echo "  $engine_gone: nothing stopped"
    rm -f "$RECORD/engine" "$RECORD/packages"
    rmdir "$RECORD" 2>/dev/null
    exit 0
fi

echo "docker-down will change this machine:"
[ "${#remove_containers[@]}" -gt 0 ] && printf '  - remove the tool'"'"'s container %s\n' "${remove_containers[@]}"
[ "${#remove_images[@]}" -gt 0 ] && echo "  - remove the tool's images: ${remove_images[*]}"
[ -n "$engine_pid" ] && echo "  - stop the dockerd docker-up started (pid $engine_pid)"
[ "${#remove_packages[@]}" -gt 0 ] && echo "  - apt-get remove, as root, the ${#remove_packages[@]} packages docker-up installed: ${remove_packages[*]}"
[ "${#keep_images[@]}" -gt 0 ] && printf '  - keep %s\n' "${keep_images[@]}"
[ "${#keep_containers[@]}" -gt 0 ] && printf '  - keep the running container %s\n' "${keep_containers[@]}"
[ -n "${engine_gone:-}" ] && echo "  - stop nothing: $engine_gone"
[ -n "$engine_note" ] && echo "  - $engine_note"

case "${CONFIRM:-}" in
    yes) ;;
    "")
        if [ -t 0 ]; then
            read -r -p "Go ahead? [y/N] " answer
            case "$answer" in y | Y | yes) ;; *) fail "nothing changed" ;; esac
        else
            fail "nothing changed; run \`make docker-down CONFIRM=yes\` to make these changes"
        fi
        ;;
    *) fail "nothing changed (CONFIRM=${CONFIRM}; CONFIRM=yes makes the changes)" ;;
esac

# ---- the changes ------------------------------------------------------------------------------

status=0
for entry in "${remove_containers[@]}"; do
    id=${entry%% *}
    if docker rm -f "$id" >/dev/null 2>/tmp/docker-down-rm.log; then
        say "removed container $entry"
    else
        say "could not remove container $id: $(tail -n 1 /tmp/docker-down-rm.log)"
        status=1
    fi
done
for ref in "${remove_images[@]}"; do
    if docker rmi "$ref" >/dev/null 2>/tmp/docker-down-rmi.log; then
        say "removed $ref"
    else
        say "could not remove $ref: $(tail -n 1 /tmp/docker-down-rmi.log) (a container of it left by a crashed run? \`bisect reset\` removes those)"
        status=1
    fi
done

if [ -n "$engine_pid" ]; then
    kill -TERM "$engine_pid" 2>/dev/null || as_root kill -TERM "$engine_pid"
    running() {  # a zombie waiting for its parent to reap it runs no more
        local state
        state=$(awk '{print $3}' "/proc/$engine_pid/stat" 2>/dev/null) || return 1
        [ -n "$state" ] && [ "$state" != Z ]
    }
    for _ in $(seq 1 30); do
        running || break
        sleep 1
    done
    if running; then
        say "dockerd (pid $engine_pid) still runs 30 s after SIGTERM; stop it by hand"
        status=1
    else
        say "stopped dockerd (pid $engine_pid)"
        rm -f "$RECORD/engine"
    fi
else
    rm -f "$RECORD/engine"
fi

if [ "${#remove_packages[@]}" -gt 0 ]; then
    if as_root env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq "${remove_packages[@]}" \
        >/tmp/docker-down-apt.log 2>&1; then
        say "removed ${#remove_packages[@]} packages"
        rm -f "$RECORD/packages"
    else
        say "apt-get remove failed (see /tmp/docker-down-apt.log)"
        status=1
    fi
else
    rm -f "$RECORD/packages"
fi
rmdir "$RECORD" 2>/dev/null
exit $status
