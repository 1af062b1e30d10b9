#!/usr/bin/env bash
# Build the MPI trainer image with podman: $IMAGE_PREFIX/mpi-runtime:$VERSION and :latest.
# BASE_IMAGE defaults to the locally made Python base (images/build-base.sh; no registry needed).
# Prints the image name.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$root/images/podman/containers.conf}"
IMAGE_PREFIX="${IMAGE_PREFIX:-localhost/kf-initializers}"
BASE_IMAGE="${BASE_IMAGE:-$("$root/images/build-base.sh")}"

cd "$root"
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
image="$IMAGE_PREFIX/mpi-runtime"
echo "build: $image:$version from $BASE_IMAGE" >&2
podman build --quiet --network host --timestamp "$epoch" \
  -f images/mpi-runtime/Dockerfile --ignorefile images/mpi-runtime/Dockerfile.dockerignore \
  --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg VERSION="$version" \
  --build-arg REVISION="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
  --build-arg SOURCE="$(git remote get-url origin 2>/dev/null || echo unknown)" \
  ${PIP_INDEX_URL:+--build-arg PIP_INDEX_URL="$PIP_INDEX_URL"} \
  -t "$image:$version" -t "$image:latest" . >/dev/null
echo "$image:$version"
