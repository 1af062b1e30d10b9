#!/usr/bin/env bash
# Install what `make bench` needs, idempotently, without touching the main test environment:
# nginx (+ Debian's headers-more module) from apt, and two venvs under .bench/ — one for the
# harness and the Python contenders (plus this project, editable), one for kserve-storage.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_DIR=${BENCH_DIR:-.bench}
PYTHON=${PYTHON:-python3}

if [ ! -x /usr/sbin/nginx ] \
    || [ ! -e /usr/lib/nginx/modules/ngx_http_headers_more_filter_module.so ] \
    || [ ! -x /usr/bin/time ] || ! command -v curl >/dev/null 2>&1; then
    apt-get update -qq
    # GNU time measures each contender's peak RSS from a small parent process.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        nginx libnginx-mod-http-headers-more-filter curl time >/dev/null
fi

mkdir -p "$BENCH_DIR"
[ -x "$BENCH_DIR/venv/bin/python" ] || "$PYTHON" -m venv "$BENCH_DIR/venv"
"$BENCH_DIR/venv/bin/python" -m pip install -q --disable-pip-version-check \
    -r benchmarks/requirements.txt -e .
[ -x "$BENCH_DIR/kserve/bin/python" ] || "$PYTHON" -m venv "$BENCH_DIR/kserve"
"$BENCH_DIR/kserve/bin/python" -m pip install -q --disable-pip-version-check \
    -r benchmarks/requirements-kserve.txt
echo "bench environment ready in $BENCH_DIR"
