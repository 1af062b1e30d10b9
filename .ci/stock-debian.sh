#!/usr/bin/env bash
# The README's two commands on a stock Debian 12 machine: python3 is Debian's (PEP 668 "externally
# managed") and neither python3-venv (ensurepip) nor python3-pip is installed, so make's venv
# must find pip the hard way. A container from the local debootstrap base (images/build-base.sh)
# plus only `apt-get install python3 make` runs `make demo`, `make demo` again (must fetch
# nothing) and `make test`, as a non-root user (STOCK_USER=root: as root), in a copy of the
# files git tracks or would add (in CI's clean clone: HEAD), never .venv, workspace or caches;
# STOCK_SOURCE=HEAD copies `git archive HEAD`, STOCK_SOURCE=DIR another checkout's files.
# --network host lets pip reach the index; the image trusts this machine's extra CA certificates
# but gets none of its pip config (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST and
# proxies are passed when set). STOCK_TARGETS overrides the targets. Exits non-zero when any
# step fails. About 4-5 min on the 2-core CI machine, most of it `make test`. Needs podman:
# runs .ci/images.sh when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/images/podman/containers.conf"
IMAGE="${STOCK_IMAGE:-localhost/kf-ci/stock-debian:bookworm}"
export DEBIAN_IMAGE="${DEBIAN_IMAGE:-localhost/kf-base/debian:bookworm}"
TARGETS="${STOCK_TARGETS:-demo demo test}"

command -v podman >/dev/null || bash .ci/images.sh
images/build-base.sh >/dev/null  # makes $DEBIAN_IMAGE when it is missing

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ctx/ca-certificates" "$work/src"
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$crt" ] && cp "$crt" "$work/ctx/ca-certificates/"
done
cat >"$work/ctx/Containerfile" <<'EOF'
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE}
# What a user types (Recommends included: python3 brings ca-certificates); nothing else.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 make \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY ca-certificates/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null 2>&1 && useradd --create-home user
EOF
podman build --quiet --network host --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" -t "$IMAGE" \
  "$work/ctx" >/dev/null

if [ "${STOCK_SOURCE:-}" = HEAD ]; then
  git archive HEAD | tar -x -C "$work/src"
else
  (cd "${STOCK_SOURCE:-.}" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] || [ -L "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -c) | tar -x -C "$work/src"
fi

pass=()
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DISABLE_PIP_VERSION_CHECK \
    HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy; do
  if [ -n "${!var:-}" ]; then pass+=(-e "$var"); fi
done

echo "stock-debian: $IMAGE, make $TARGETS"
podman run --rm --network host --user "${STOCK_USER:-user}" -v "$work/src:/src:ro" "${pass[@]}" \
  -e TARGETS="$TARGETS" "$IMAGE" bash -c '
set -euo pipefail
# The hard path, or this check proves nothing: no ensurepip, no pip, an externally managed python.
! python3 -c "import ensurepip" 2>/dev/null || { echo "not stock: ensurepip is installed"; exit 1; }
! python3 -m pip --version >/dev/null 2>&1 || { echo "not stock: pip is installed"; exit 1; }
ls /usr/lib/python3*/EXTERNALLY-MANAGED >/dev/null
echo "stock-debian: $(python3 --version) at $(command -v python3), user $(id -un)"
cd && cp -R /src kf && cd kf
demos=0
for target in $TARGETS; do
  start=$SECONDS
  echo "== make $target"
  make "$target" 2>&1 | tee ../make.log \
    || { echo "stock-debian: make $target FAILED after $((SECONDS - start)) s"; exit 1; }
  echo "== make $target: $((SECONDS - start)) s"
  if [ "$target" = demo ] && [ $((demos += 1)) -gt 1 ]; then
    grep -q "nothing to fetch" ../make.log && ! grep -q " fetched, " ../make.log \
      || { echo "stock-debian: a second make demo fetched again"; exit 1; }
  fi
done
'
