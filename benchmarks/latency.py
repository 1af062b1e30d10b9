"""The latency option of the endpoints: nginx waits before the first byte of every response.

Real S3 and the Hub's CDN answer after 10-50 ms; on loopback the answer is immediate, which
hides what many small files cost a client with few requests in flight. The delayed ports of
:class:`benchmarks.endpoints.Endpoints` run ``access_by_lua_block { ngx.sleep(...) }`` (Debian's
``libnginx-mod-http-lua``, installed by ``benchmarks/setup.sh``) at server level, so object and
CDN GETs, HEADs, listings, the Hub's API and its redirects all wait. ``ngx.sleep`` is a timer in
nginx's event loop: the worker serves other requests meanwhile and spends no CPU on the wait,
and the bytes still go out by sendfile, so the figures measure the clients, not a proxy.
Requests that nginx answers with ``return`` (an error page) are not delayed.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_DELAY_S = 0.020
MODULES_DIR = Path("/usr/lib/nginx/modules")
# The Lua module needs Nginx Development Kit's module loaded before it.
MODULES = (MODULES_DIR / "ndk_http_module.so", MODULES_DIR / "ngx_http_lua_module.so")


def missing_modules() -> list[Path]:
    """The nginx modules the delay needs that are not installed."""
    return [m for m in MODULES if not m.exists()]


def first_byte_delay(seconds: float) -> str:
    """The server-level nginx directive that holds every response ``seconds`` before it starts."""
    if seconds <= 0:
        return ""
    return f"access_by_lua_block {{ ngx.sleep({seconds:.3f}) }}"
