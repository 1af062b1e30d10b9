#!/usr/bin/env bash
# Debian packages the test suites need (podman for images, sshd for MPI, nginx for benchmarks).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
