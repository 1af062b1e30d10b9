#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine to build and run the images (`make images`, `make e2e`):
# podman with runc (crun fails on some kernels), CNI bridge networking (the tests' per-job bridge
# network, as the Kubeflow SDK's local backend makes), and debootstrap for the local base image,
# since no container registry is reachable. Then checks that podman works with our settings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/system-packages.sh podman runc debootstrap iptables containernetworking-plugins
CONTAINERS_CONF="$PWD/images/podman/containers.conf" podman info >/dev/null
