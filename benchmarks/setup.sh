#!/usr/bin/env bash
# Install what `make bench` needs, idempotently, without touching the main test environment:
# nginx (+ Debian's headers-more and Lua modules) from apt, and two venvs under .bench/ — one for
# the harness and the Python contenders (plus this project, editable), one for kserve-storage.
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_DIR=${BENCH_DIR:-.bench}
PYTHON=${PYTHON:-python3}

if [ ! -x /usr/sbin/nginx ] \
    || [ ! -e /usr/lib/nginx/modules/ngx_http_headers_more_filter_module.so ] \
    || [ ! -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] \
    || [ ! -x /usr/bin/time ] || ! command -v curl >/dev/null 2>&1; then
    apt-get update -qq
    # GNU time measures each contender's peak RSS from a small parent process. The Lua module
    # delays the first byte of every response of the latency scenario's ports (a timer in
    # nginx's event loop: no CPU spent while waiting); it pulls in the NDK module it needs.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        nginx libnginx-mod-http-headers-more-filter libnginx-mod-http-lua curl time >/dev/null
fi

# scripts/mkvenv.py: reuses a working venv; makes one even without python3-venv (ensurepip).
"$PYTHON" scripts/mkvenv.py "$BENCH_DIR/venv" -q --disable-pip-version-check \
    -r benchmarks/requirements.txt -e .
"$PYTHON" scripts/mkvenv.py "$BENCH_DIR/kserve" -q --disable-pip-version-check \
    -r benchmarks/requirements-kserve.txt
echo "bench environment ready in $BENCH_DIR"
