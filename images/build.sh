#!/usr/bin/env bash
# Build the dataset and model initializer images with podman (what `make images` runs).
#   images/build.sh            -> $IMAGE_PREFIX/dataset-initializer:$VERSION and :latest (+ model),
#                                 and each one's non-root variant, :$VERSION-nonroot and :nonroot
# BASE_IMAGE defaults to the locally made Python base (images/build-base.sh; no registry needed);
# set BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm where a registry is reachable.
# PIP_INDEX_URL, when set, is passed to the build stage only (never stored in the image).
# Prints the four image names, one a line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/podman/containers.conf}"
IMAGE_PREFIX="${IMAGE_PREFIX:-localhost/kf-initializers}"
BASE_IMAGE="${BASE_IMAGE:-$("$here/build-base.sh")}"

cd "$root"
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
revision="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
source_url="$(git remote get-url origin 2>/dev/null || echo unknown)"
# Reproducible layers: every file time and the image's creation time are the last commit's.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

for target in dataset-initializer model-initializer; do
  image="$IMAGE_PREFIX/$target"
  # The image, then its non-root variant (the same layers, USER 65532:0), tagged -nonroot.
  for variant in "" -nonroot; do
    alias=latest
    [ -z "$variant" ] || alias=nonroot
    echo "build: $image:$version$variant from $BASE_IMAGE" >&2
    podman build --quiet --network host --timestamp "$epoch" \
      -f images/initializer/Dockerfile --ignorefile images/initializer/Dockerfile.dockerignore \
      --target "$target$variant" --build-arg BASE_IMAGE="$BASE_IMAGE" \
      --build-arg VERSION="$version" --build-arg REVISION="$revision" \
      --build-arg SOURCE="$source_url" \
      ${PIP_INDEX_URL:+--build-arg PIP_INDEX_URL="$PIP_INDEX_URL"} \
      -t "$image:$version$variant" -t "$image:$alias" . >/dev/null
    echo "$image:$version$variant"
  done
done
