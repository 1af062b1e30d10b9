#!/usr/bin/env bash
# Make the local base images every Dockerfile here can be built FROM, without a registry:
#   localhost/kf-base/debian:bookworm       debootstrap --variant=minbase of Debian bookworm
#   localhost/kf-base/python:3.11-bookworm  that + Python 3.11 (python, venv), ca-certificates
# Idempotent: the Debian rootfs is made only when its image is missing (--force remakes it), and
# the Python layer comes from podman's build cache when nothing changed, so a rerun takes ~1 s.
# Prints the Python base's name last, for `--build-arg BASE_IMAGE=$(images/build-base.sh)`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/podman/containers.conf}"
DEBIAN_IMAGE="${DEBIAN_IMAGE:-localhost/kf-base/debian:bookworm}"
PYTHON_BASE_IMAGE="${PYTHON_BASE_IMAGE:-localhost/kf-base/python:3.11-bookworm}"
force=0
[ "${1:-}" = "--force" ] && force=1

log() { echo "build-base: $*" >&2; }
need() {
  command -v "$1" >/dev/null || { log "$1 is missing; run: bash .ci/images.sh"; exit 2; }
}
need podman
need runc

# The apt mirror this machine uses (deb822 sources first, then the classic list).
apt_mirror() {
  local uri=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
  fi
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri="$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list)"
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# Trim the rootfs the way Debian's -slim images are: no downloaded .debs, apt lists, logs, docs,
# man pages or translations, and a dpkg filter so later installs skip them too.
slim_rootfs() {
  local root="$1"
  cat >"$root/etc/dpkg/dpkg.cfg.d/slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
CFG
  find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian/* \
    "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/* \
    "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/var/cache/debconf/*-old
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ "$force" = 1 ] || ! podman image exists "$DEBIAN_IMAGE"; then
  need debootstrap
  mirror="${DEBIAN_MIRROR:-$(apt_mirror)}"
  log "debootstrap bookworm from $mirror (about 35 s)"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; log "debootstrap failed (log above)"; exit 1; }
  slim_rootfs "$work/rootfs"
  tar --numeric-owner -C "$work/rootfs" -c . \
    | podman import --quiet --change 'CMD ["/bin/bash"]' - "$DEBIAN_IMAGE" >/dev/null
  rm -rf "$work/rootfs"
fi

# Build context: the Containerfile plus this machine's extra CA certificates (may be none).
mkdir -p "$work/ctx/ca-certificates"
cp "$here/base/Containerfile" "$work/ctx/"
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$crt" ] && cp "$crt" "$work/ctx/ca-certificates/"
done
log "python base $PYTHON_BASE_IMAGE"
podman build --quiet --network host --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" \
  -t "$PYTHON_BASE_IMAGE" "$work/ctx" >/dev/null
echo "$PYTHON_BASE_IMAGE"
