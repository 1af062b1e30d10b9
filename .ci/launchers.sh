#!/usr/bin/env bash
# Prepare a fresh Debian 12 machine for the launcher tests (`make test-launchers`): sshd for the
# loopback "nodes", Debian's Open MPI 4 and MPICH for the dialect tests (Open MPI 5 and mpi4py
# come from PyPI), and the pinned CPU torch — into the project's venv, as `make test-launchers`
# would (`make install-launchers`; PYTHON, when set, is the interpreter the venv is made from).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/system-packages.sh openssh-server openmpi-bin mpich make
make install-launchers
