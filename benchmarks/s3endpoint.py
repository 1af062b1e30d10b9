"""A fast S3 endpoint on 127.0.0.1: nginx serves object bytes from disk, Python answers listings.

nginx routes by request shape: a plain ``GET``/``HEAD /bucket/key`` (presigned or not) is a
static file with Range, keep-alive and sendfile, and an ETag from a generated map (S3's MD5 or
multipart shape, so ``If-Match`` from s3transfer agrees). As S3 does, a whole-object GET/HEAD
that asks for checksums (``x-amz-checksum-mode: ENABLED``, no ``Range``) also gets the object's
``x-amz-checksum-crc32`` and ``x-amz-checksum-type`` (FULL_OBJECT or COMPOSITE), from generated
maps too; other requests get neither. Requests on the bucket itself, object requests with a
sub-resource query (``?partNumber=``, ``?versionId=``, ...) and other methods go to
:mod:`benchmarks.s3api`. Path-style addressing only, no signature checks. The nginx-style flavour
(``nginx_etags``) serves the same objects as S3-compatible servers fronted by a plain web
server or a CDN do: nginx's own ETags (not MD5s), no checksums, in listings and GETs alike.
A server given a certificate (``tls``) answers over HTTPS only, as every real S3 endpoint does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.fixtures import BUCKET, Fixture
from benchmarks.nginx import wait_for_port
from benchmarks.s3api import NGINX_FLAVOUR

# Query parameters that make a request on an object an operation other than reading its bytes.
_SUBRESOURCE_NAMES = """partNumber versionId uploadId uploads acl tagging attributes torrent
    retention legal-hold restore select"""
SUBRESOURCES = "|".join(_SUBRESOURCE_NAMES.split())
NO_SUCH_KEY = (
    '<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code>'
    "<Message>The specified key does not exist.</Message><RequestId>bench</RequestId></Error>"
)


def etag_map(fixture: Fixture) -> str:
    """nginx ``map $uri $s3_etag`` with every object's S3 ETag."""
    lines = ["map $uri $s3_etag {", '    default "";']
    for key, obj in sorted(fixture.objects.items()):
        lines.append(f"    \"/{BUCKET}/{key}\" '{obj.etag}';")
    lines.append("}")
    return "\n".join(lines) + "\n"


def checksum_maps(fixture: Fixture) -> str:
    """nginx ``map $uri $s3_crc32`` and ``map $uri $s3_checksum_type`` for every object."""
    lines = []
    for var, field in (("$s3_crc32", "checksum_crc32"), ("$s3_checksum_type", "checksum_type")):
        lines += [f"map $uri {var} {{", '    default "";']
        for key, obj in sorted(fixture.objects.items()):
            lines.append(f"    \"/{BUCKET}/{key}\" '{getattr(obj, field)}';")
        lines.append("}")
    return "\n".join(lines) + "\n"


def s3_http_shared(fixture: Fixture, run_dir: Path, api_port: int) -> str:
    """What every S3 server of nginx's ``http {}`` shares: the maps and the API upstream."""
    (run_dir / "etags.map").write_text(etag_map(fixture))
    (run_dir / "checksums.map").write_text(checksum_maps(fixture))
    return f"""
    include {run_dir}/etags.map;
    include {run_dir}/checksums.map;
    # S3 sends an object's checksum only when asked (x-amz-checksum-mode: ENABLED) and only for
    # the whole object (no Range); add_header skips the empty values of every other request.
    map "$http_x_amz_checksum_mode:$http_range" $s3_checksum_on {{ "~*^enabled:$" 1; default 0; }}
    map $s3_checksum_on $s3_crc32_out {{ 1 $s3_crc32; default ""; }}
    map $s3_checksum_on $s3_checksum_type_out {{ 1 $s3_checksum_type; default ""; }}
    # Query strings that make a request on an object something other than a plain GET/HEAD of
    # its bytes; presigned (X-Amz-*) and x-id=GetObject queries are plain GETs.
    map $args $s3_has_args {{ "~(^|&)({SUBRESOURCES})(=|&|$)" 1; default 0; }}
    map $uri $s3_is_bucket {{ ~^/[^/]*/?$ 1; default 0; }}
    map $request_method $s3_other_method {{ GET 0; HEAD 0; default 1; }}
    map "$s3_has_args$s3_is_bucket$s3_other_method" $s3_to_api {{ "000" 0; default 1; }}
    map "$http_if_match=$s3_etag" $s3_if_match_ok {{ "~^(.+)=\\1$" 1; default 0; }}
    upstream s3api {{ server 127.0.0.1:{api_port}; keepalive 32; }}
"""


def s3_server(
    fixture: Fixture, port: int, extra: str = "", nginx_etags: bool = False,
    tls: tuple[Path, Path] | None = None,
) -> str:  # fmt: skip
    """One S3 ``server {}`` on ``port`` (after :func:`s3_http_shared`); ``extra``: server-level
    directives (the latency option's delay); ``nginx_etags``: the nginx-style flavour; ``tls``:
    (certificate, key) PEM files, to answer over HTTPS."""
    if nginx_etags:  # nginx's own ETag, and its own If-Match check against it
        headers = "add_header x-amz-request-id bench;"
        flavour = f"proxy_set_header {NGINX_FLAVOUR} nginx;"
    else:
        # nginx checks If-Match against its own ETag ("mtime-size"); ours is S3's. When the
        # client's If-Match is our ETag, drop it so the request is served; a stale one still
        # gets nginx's 412, as S3 would answer.
        headers = """if ($s3_if_match_ok) { more_clear_input_headers If-Match; }
            etag off;
            add_header ETag $s3_etag;
            add_header x-amz-checksum-crc32 $s3_crc32_out;
            add_header x-amz-checksum-type $s3_checksum_type_out;
            add_header x-amz-request-id bench;"""
        flavour = f"proxy_set_header {NGINX_FLAVOUR} s3;"
    return f"""
    server {{
        {_listen(port, tls)}
        root {fixture.data_root};
        {extra}
        location / {{
            error_page 418 = @s3api;
            error_page 404 = @nosuchkey;
            if ($s3_to_api) {{ return 418; }}
            {headers}
        }}
        location @s3api {{
            proxy_pass http://s3api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            {flavour}
            proxy_buffering off;
            proxy_request_buffering off;
        }}
        location @nosuchkey {{
            default_type application/xml;
            return 404 '{NO_SUCH_KEY}';
        }}
    }}
"""


def _listen(port: int, tls: tuple[Path, Path] | None) -> str:
    if tls is None:
        return f"listen 127.0.0.1:{port} backlog=4096;"
    certificate, key = tls
    # Sessions are resumed, as clients of a real endpoint see: a new connection's handshake is
    # not what the scenario measures.
    return f"""listen 127.0.0.1:{port} ssl backlog=4096;
        ssl_certificate {certificate};
        ssl_certificate_key {key};
        ssl_session_cache shared:bench_tls:10m;"""


def start_s3api(fixture: Fixture, port: int) -> subprocess.Popen:
    """The listing layer, in a process of its own."""
    argv = [
        sys.executable, "-m", "benchmarks.s3api",
        "--index", str(fixture.root / "index.json"),
        "--data", str(fixture.data_root),
        "--port", str(port),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )
    wait_for_port(port)
    return proc
