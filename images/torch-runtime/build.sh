#!/usr/bin/env bash
# Build the torch trainer image with podman: $IMAGE_PREFIX/torch-runtime:$VERSION and :latest.
# BASE_IMAGE defaults to the locally made Python base (images/build-base.sh; no registry needed).
# TORCH_VERSION / TORCH_INDEX_URL pick the torch build (default: the CPU one from PyTorch's index).
# Where pip here finds wheels in a local folder (PIP_FIND_LINKS, as on the CI machine, which has
# the CPU torch wheel there and no route to PyTorch's index), that folder is mounted read-only
# into the build and PyTorch's index is not asked; nothing of it stays in the image.
# Prints the image name.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/images/podman/containers.conf}"
IMAGE_PREFIX="${IMAGE_PREFIX:-localhost/kf-initializers}"
BASE_IMAGE="${BASE_IMAGE:-$("$root/images/build-base.sh")}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0+cpu}"
TORCH_INDEX_URL="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"

cd "$root"
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
wheels=()
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
  wheels=(-v "$PIP_FIND_LINKS:$PIP_FIND_LINKS:ro" --build-arg PIP_FIND_LINKS="$PIP_FIND_LINKS")
  TORCH_INDEX_URL=""
fi
image="$IMAGE_PREFIX/torch-runtime"
echo "build: $image:$version (torch $TORCH_VERSION) from $BASE_IMAGE" >&2
podman build --quiet --network host --timestamp "$epoch" "${wheels[@]}" \
  -f images/torch-runtime/Dockerfile --ignorefile images/torch-runtime/Dockerfile.dockerignore \
  --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_VERSION="$TORCH_VERSION" \
  --build-arg TORCH_INDEX_URL="$TORCH_INDEX_URL" \
  --build-arg VERSION="$version" \
  --build-arg REVISION="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
  --build-arg SOURCE="$(git remote get-url origin 2>/dev/null || echo unknown)" \
  ${PIP_INDEX_URL:+--build-arg PIP_INDEX_URL="$PIP_INDEX_URL"} \
  -t "$image:$version" -t "$image:latest" . >/dev/null
echo "$image:$version"
