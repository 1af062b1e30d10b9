#!/usr/bin/env bash
# Regenerate requirements.lock: exact versions + hashes of the package's runtime dependencies
# (pyproject.toml [project].dependencies only; no extras, no test tools) and of its build backend
# (setuptools, so the image build fetches nothing unpinned), resolved from PyPI alone for
# CPython 3.11 on Linux. Run after changing those dependencies; the image build fails at
# `pip check` while the lock is stale.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv "$venv"
"$venv/bin/pip" install -q 'pip-tools==7.*'
cd "$root"
CUSTOM_COMPILE_COMMAND="images/initializer/update-lock.sh" \
  "$venv/bin/pip-compile" --quiet --generate-hashes --strip-extras --all-build-deps --allow-unsafe --no-emit-index-url \
  --output-file images/initializer/requirements.lock pyproject.toml
