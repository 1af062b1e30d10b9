#!/bin/sh
# Entrypoint of the initializer images.
#   IMAGE [--flags...]      runs the initializer named by $INITIALIZER_KIND with those flags
#                           (no arguments: configured from the environment alone)
#   IMAGE COMMAND [ARGS...] runs that command, e.g. the Kubeflow SDK's local backend's
#                           `bash -c "python -m pkg.initializers.dataset"`
#
# Started as root (docker/podman without --user, as the Kubeflow SDK's local backend runs it), it
# first gives the destination folder to an unprivileged user, then re-executes itself as that
# user before running anything, so neither the initializer nor a given command ever runs as root:
#   * the owner of the volume holding the destination (OUTPUT_PATH, --output, default
#     /workspace/$INITIALIZER_KIND), when that owner is not root: a host folder bind-mounted by
#     its user (the SDK's ~/.kubeflow/trainer/containers/JOB), so the files are theirs;
#   * otherwise (a root-owned volume, no volume at all) the image's own user 65532:0, for whom it
#     creates the destination.
# Entries inside the destination owned by someone else (an earlier run as root, or as another
# user) are handed over too, never following a symlink and never leaving the destination.
# Started as any other user (Kubernetes' runAsUser, OpenShift, --user) it changes nothing.
# Either way it finds a writable HOME (and temp dir) for any UID, even with a read-only root
# filesystem where the /workspace volume is the only writable path.
set -eu

IMAGE_UID=65532
IMAGE_GID=0

# One line on stderr and in the termination log (as the initializer does), then exit 2.
refuse() {
  echo "error: $*" >&2
  log="${TERMINATION_LOG:-/dev/termination-log}"
  if [ -w "$log" ] && [ ! -d "$log" ]; then
    echo "error: $*" >"$log" 2>/dev/null || true
  fi
  exit 2
}

# The destination the initializer will write: the last --output/--output= (argparse takes the
# last; nothing after `--` is a flag), else OUTPUT_PATH, else the default; made absolute without
# resolving symlinks.
destination() {
  dest="${OUTPUT_PATH:-/workspace/${INITIALIZER_KIND:-}}"
  value=""
  for arg in "$@"; do
    if [ -n "$value" ]; then
      dest="$arg" value=""
      continue
    fi
    case "$arg" in
      --) break ;;
      --output) value=1 ;;
      --output=*) dest="${arg#--output=}" ;;
    esac
  done
  realpath -m -s -- "${dest:-.}"
}

# The nearest existing folder at or above $1 that is not a symlink.
nearest_folder() {
  near="$1"
  while [ ! -d "$near" ] || [ -L "$near" ]; do
    near="$(dirname -- "$near")"
  done
  echo "$near"
}

# The owner (UID:GID) of the volume holding $1: its mount point, found in the kernel's mount
# table through the nearest existing folder (that folder itself if the table says nothing).
volume_owner() {
  near="$(nearest_folder "$1")"
  mount="$(findmnt -n -o TARGET --target "$near" 2>/dev/null)" || mount=""
  [ -d "$mount" ] || mount="$near"
  stat -c '%u:%g' -- "$mount"
}

# True when no component of the existing path $1 is a symlink.
direct() { [ "$(realpath -e -- "$1" 2>/dev/null)" = "$1" ]; }

# As root: give UID:GID ($2:$3) every entry inside the destination $1 that is not already theirs,
# first creating the destination for them when asked ($4 = create). Best effort: whatever fails
# here (a read-only or root-squashed volume) the unprivileged initializer reports (exit 6).
# Nothing is done through a symlink: one in the destination's path leaves it to the initializer
# (which refuses it, exit 6); -xdev keeps out of other volumes mounted inside; -execdir runs each
# chown in the entry's own folder, so a folder swapped for a symlink meanwhile cannot redirect it.
hand_over() {
  dest="$1" uid="$2" gid="$3"
  if [ "$4" = create ] && [ ! -e "$dest" ] && [ ! -L "$dest" ]; then
    near="$(nearest_folder "$dest")"
    if direct "$near" && mkdir -p -- "$dest" 2>/dev/null; then
      made="$dest"
      while [ "$made" != "$near" ] && [ "$made" != / ]; do
        chown -h -- "$uid:$gid" "$made" 2>/dev/null || true
        made="$(dirname -- "$made")"
      done
    fi
  fi
  if [ -d "$dest" ] && direct "$dest"; then
    PATH=/usr/bin:/bin find "$dest" -xdev ! -user "$uid" \
      -execdir chown -h -- "$uid:$gid" {} + 2>/dev/null || true
  fi
}

# Whether the effective capabilities hold every bit of mask $1.
has_capabilities() {
  effective="$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)"
  [ "$((0x${effective:-0} & $1))" = "$(($1))" ]
}

if [ "$(id -u)" = 0 ]; then
  # The host UID that container root is: 0, unless in a user namespace (rootless podman/docker).
  host_root=0
  if [ -r /proc/self/uid_map ]; then
    while read -r inside outside _; do
      if [ "$inside" = 0 ]; then host_root="$outside"; fi
    done </proc/self/uid_map
  fi
  bounding="$(sed -n 's/^CapBnd:[[:space:]]*//p' /proc/self/status)"
  dest="$(destination "$@")"
  owner="$(volume_owner "$dest")"
  uid="${owner%%:*}" gid="${owner#*:}"
  if [ "$host_root" = 0 ]; then
    # Real root. Changing UID and GID needs CAP_SETUID and CAP_SETGID (0xc0).
    has_capabilities 0xc0 || refuse "started as root without CAP_SETUID and CAP_SETGID, so it" \
      "cannot stop being root: run it as a non-root user (--user 65532:0, or runAsUser)"
    if [ "$uid" = 0 ]; then
      uid="$IMAGE_UID" gid="$IMAGE_GID"
      hand_over "$dest" "$uid" "$gid" create
    else
      hand_over "$dest" "$uid" "$gid" existing
    fi
    exec setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs -- "$0" "$@"
  elif [ "$((0x${bounding:-0}))" != 0 ]; then
    # Container root is an unprivileged host user (rootless). When it owns the volume, that is
    # the host user's folder and no other container UID could write there as them: keep UID 0,
    # without any capability and no way to gain one (so this branch is not taken again).
    has_capabilities 0x1c0 || refuse "started as root in a user namespace without CAP_SETUID," \
      "CAP_SETGID and CAP_SETPCAP, so it cannot drop its capabilities: run it as a non-root user"
    # A namespace made without newgidmap denies setgroups: its groups cannot grow either.
    groups=--clear-groups
    if [ "$(cat /proc/self/setgroups 2>/dev/null)" = deny ]; then groups=--keep-groups; fi
    hand_over "$dest" "$uid" "$gid" existing
    if [ "$uid" = 0 ]; then
      exec setpriv --reuid=0 --regid="$gid" "$groups" --inh-caps=-all --bounding-set=-all \
        --no-new-privs -- "$0" "$@"
    fi
    exec setpriv --reuid="$uid" --regid="$gid" "$groups" --no-new-privs -- "$0" "$@"
  fi
fi

writable() { [ -d "$1" ] && [ -w "$1" ] && [ -x "$1" ]; }

if ! writable "${HOME:-/nonexistent}"; then
  if writable /tmp; then
    HOME=/tmp
  elif writable /workspace && mkdir -p /workspace/.home 2>/dev/null; then
    HOME=/workspace/.home
  fi
  export HOME
fi
if ! writable "${TMPDIR:-/tmp}" && writable "$HOME"; then
  export TMPDIR="$HOME"
fi

if [ "$#" -eq 0 ]; then
  exec "${INITIALIZER_KIND:?the image sets INITIALIZER_KIND}-initializer"
fi
case "$1" in
  -*) exec "${INITIALIZER_KIND}-initializer" "$@" ;;
esac
if command -v "$1" >/dev/null 2>&1; then
  exec "$@"
fi
# Not a command: let the initializer report the stray argument as a usage error (exit 2).
exec "${INITIALIZER_KIND}-initializer" "$@"
