#!/bin/sh
# Entrypoint of the initializer images.
#   IMAGE [--flags...]      runs the initializer named by $INITIALIZER_KIND with those flags
#                           (no arguments: configured from the environment alone)
#   IMAGE COMMAND [ARGS...] runs that command, e.g. the Kubeflow SDK's local backend's
#                           `bash -c "python -m pkg.initializers.dataset"`
# It also finds a writable HOME (and temp dir) for any UID, even with a read-only root
# filesystem where the /workspace volume is the only writable path.
set -eu

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
