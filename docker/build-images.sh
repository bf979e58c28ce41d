#!/usr/bin/env bash
# Builds fedpriv's Docker images with no registry image and no package index inside a build:
#
#   base    the image fedpriv-base:bookworm: Debian bookworm by `debootstrap --variant=minbase`
#           from the host's Debian mirror, with python3 (3.11, the Python the wheelhouse is built for), python3-venv,
#           gcc and libc6-dev (the SuperNode's native kernel), imported with `docker import`.
#           Skipped when the image exists (--rebuild-base builds it again). Needs root.
#   wheels  docker/wheels: fedpriv's wheel, built from this checkout, and its dependencies, by
#           `pip wheel` on the host with the host's pip configuration, pinned to the NEWEST
#           supported stack, ci/constraints-newest.txt (Flower 1.42: SuperNodes on the HTTP Fleet
#           API, as docker/compose.yml expects; copied to docker/wheels/constraints.txt). Wheels
#           already there are reused; fedpriv's own wheel is built again every time.
#   images  fedpriv-superlink:TAG and fedpriv-supernode:TAG from the build sections of
#           docker/compose.yml (context docker/; the Dockerfiles install from the wheelhouse with
#           `pip install --no-index --find-links`).
#
# Usage (from anywhere; root for the base):
#   docker/build-images.sh [base] [wheels] [images] [--rebuild-base]     (no step: all three)
# Environment:
#   PYTHON         host Python 3.11 with pip, the images' Python (default: the checkout's
#                  .venv-newest/bin/python, else .venv/bin/python, else python3)
#   CONSTRAINTS    the wheelhouse's pins (default: ci/constraints-newest.txt)
#   FEDPRIV_TAG    tag of the two images (default latest), as in compose.yml
#   FEDPRIV_BASE   base image name (default fedpriv-base:bookworm), as in compose.yml
#   DEBIAN_MIRROR  Debian mirror for debootstrap (default: the Debian mirror of the host's apt
#                  sources, else http://deb.debian.org/debian)
#   COMPOSE        compose command (default: `docker compose` if it works, else docker-compose)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
BASE=${FEDPRIV_BASE:-fedpriv-base:bookworm}
export FEDPRIV_TAG=${FEDPRIV_TAG:-latest} FEDPRIV_BASE=$BASE
WHEELS=$HERE/wheels
SUITE=bookworm

say() { echo "build-images: $*" >&2; }
die() { say "error: $*"; exit 1; }

steps=() rebuild_base=0
for arg in "$@"; do
    case $arg in
        base|wheels|images) steps+=("$arg") ;;
        --rebuild-base) rebuild_base=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $arg (steps: base wheels images; --rebuild-base)" ;;
    esac
done
[ ${#steps[@]} -gt 0 ] || steps=(base wheels images)

# The first URI of the host's apt sources (one-line or deb822 format) whose path ends in $1.
host_mirror() {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed -n -E 's/^[[:space:]]*(deb[[:space:]]+(\[[^]]*\][[:space:]]+)?|URIs:[[:space:]]*)([^[:space:]]+).*/\3/p' \
        | grep -E "$1/?\$" | head -n 1 || true
}

build_base() {
    if [ "$rebuild_base" = 0 ] && docker image inspect "$BASE" >/dev/null 2>&1; then
        say "base: $BASE exists (cached; --rebuild-base to build it again)"
        return
    fi
    [ "$(id -u)" = 0 ] || die "base: debootstrap and chroot need root"
    command -v debootstrap >/dev/null || die "base: no debootstrap (apt-get install debootstrap)"
    local mirror security rootfs
    mirror=${DEBIAN_MIRROR:-$(host_mirror '/debian')}
    mirror=${mirror:-http://deb.debian.org/debian}
    security=$(host_mirror '/debian-security')
    rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/fedpriv-rootfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$rootfs'" EXIT
    say "base: debootstrap --variant=minbase $SUITE from $mirror"
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
        || { tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; die "base: debootstrap failed"; }
    rm -f "$rootfs.log"
    {
        echo "deb $mirror $SUITE main"
        echo "deb $mirror $SUITE-updates main"
        [ -z "$security" ] || echo "deb $security $SUITE-security main"
    } >"$rootfs/etc/apt/sources.list"
    # no documentation, manual pages or translations (as Debian's slim images)
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/01-fedpriv-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod 755 "$rootfs/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    say "base: apt-get install python3 python3-venv gcc libc6-dev"
    chroot "$rootfs" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get install -y -qq --no-install-recommends \
        python3 python3-venv gcc libc6-dev >/dev/null
    chroot "$rootfs" apt-get clean
    chroot "$rootfs" python3 -c 'import sys, venv; assert sys.version_info[:2] == (3, 11), sys.version'
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* \
        "$rootfs/usr/sbin/policy-rc.d" "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/tmp/* "$rootfs"/root/.cache
    find "$rootfs/usr/share/doc" -mindepth 1 -type f ! -name copyright -delete 2>/dev/null || true
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
    : >"$rootfs/etc/resolv.conf"
    say "base: docker import $BASE"
    tar -C "$rootfs" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
        | docker import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'CMD ["/bin/bash"]' \
            --change 'LABEL org.opencontainers.image.description="Debian bookworm (debootstrap minbase) with python3, python3-venv, gcc: fedpriv image base"' \
            --message "debootstrap --variant=minbase $SUITE $mirror + python3 python3-venv gcc libc6-dev" \
            - "$BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
}

build_wheels() {
    local py=${PYTHON:-} constraints=${CONSTRAINTS:-$ROOT/ci/constraints-newest.txt}
    if [ -z "$py" ]; then
        if [ -x "$ROOT/.venv-newest/bin/python" ]; then py=$ROOT/.venv-newest/bin/python
        elif [ -x "$ROOT/.venv/bin/python" ]; then py=$ROOT/.venv/bin/python
        else py=python3; fi
    fi
    "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        || die "wheels: $py is not Python 3.11 (the images' Python; set PYTHON)"
    [ -f "$constraints" ] || die "wheels: no constraints file $constraints"
    grep -q '^flwr==' "$constraints" || die "wheels: $constraints pins no flwr"
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/fedpriv-*.whl
    # the pins of the newest supported stack (the versions the deployment tests run with)
    {
        echo "# pins of the wheelhouse: $(basename "$constraints") (written by docker/build-images.sh)"
        grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$constraints"
    } >"$WHEELS/constraints.txt"
    say "wheels: pins of $(basename "$constraints"): $(grep -E '^(flwr|torch)==' "$constraints" | paste -sd' ')"
    local wheel=("$py" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WHEELS" --find-links "$WHEELS" -c "$WHEELS/constraints.txt")
    # every pinned wheel there already (a warm wheelhouse): no index, fedpriv built with the host's setuptools
    if "${wheel[@]}" --no-index --no-build-isolation "$ROOT[torch]" >/dev/null 2>&1; then
        say "wheels: fedpriv built, dependencies from the wheelhouse (no index)"
    else
        say "wheels: pip wheel fedpriv and its dependencies into $WHEELS (package index: the host's pip configuration)"
        "${wheel[@]}" "$ROOT[torch]" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    fi
    ls "$WHEELS"/fedpriv-*.whl >/dev/null 2>&1 || die "wheels: no fedpriv wheel was built"
    say "wheels: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1)"
}

compose_cmd() {
    if [ -n "${COMPOSE:-}" ]; then echo "$COMPOSE"
    elif docker compose version >/dev/null 2>&1; then echo "docker compose"
    elif command -v docker-compose >/dev/null; then echo docker-compose
    else die "images: neither \`docker compose\` nor docker-compose found"
    fi
}

build_images() {
    docker image inspect "$BASE" >/dev/null 2>&1 || die "images: no base image $BASE (run the base step)"
    ls "$WHEELS"/fedpriv-*.whl >/dev/null 2>&1 || die "images: no wheelhouse in $WHEELS (run the wheels step)"
    local compose
    compose=$(compose_cmd)
    say "images: $compose build (fedpriv-superlink:$FEDPRIV_TAG, fedpriv-supernode:$FEDPRIV_TAG on $BASE)"
    local parallel=()
    [ "$compose" != docker-compose ] || parallel=(--parallel)  # `docker compose` builds in parallel anyway
    $compose -f "$HERE/compose.yml" build "${parallel[@]}" superlink supernode-0
    # the install stages (wheelhouse + venv, ~3 GB) stay behind as untagged images with the classic builder
    docker image prune -f --filter label=org.fedpriv.stage=install >/dev/null
}

for step in "${steps[@]}"; do
    t0=$(date +%s.%N)
    "build_$step"
    say "$step: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
done
