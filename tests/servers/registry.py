"""A real OCI registry on 127.0.0.1 (CNCF Distribution 2.8, Debian's ``docker-registry``).

For the ``oci://`` specs: artifacts are pushed with the real clients (``oras`` for files,
``skopeo copy`` for OCI image layouts written by :func:`write_layout`), so what a spec pulls is
what those tools make. ``auth="basic"`` checks an htpasswd (bcrypt) file; ``auth="token"`` is
Distribution's token auth: the registry trusts one certificate, and a small token endpoint in a
thread here issues RS256 JWTs signed with its key (``x5c`` in the header) to the one account
(``username``/``password``), for exactly the actions each scope asks; anonymous requests to it
get 401. ``tls=True`` serves https (the token endpoint too) with a certificate for 127.0.0.1 that
a private CA (``ca_file``) signed. Everything the registry, skopeo and oras write lives under
``root``; nothing is contacted but 127.0.0.1.
"""

from __future__ import annotations

import base64
import gzip as gz
import hashlib
import importlib.util
import io
import itertools
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.servers.ports import free_port, wait_for_port
from tests.servers.tls import ca_signed, self_signed

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ANY_MANIFEST = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
IMAGE_CONFIGS = (
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
)
TITLE = "org.opencontainers.image.title"
GRANTABLE = ("pull", "push", "delete", "*")  # the one account may do anything it asks for
_MTIME = 1_700_000_000  # every tar member's mtime: layers are byte-for-byte reproducible
_pushes = itertools.count()


def binary() -> str | None:
    """The registry executable (Debian names it ``docker-registry``), or None."""
    return shutil.which("docker-registry") or shutil.which("registry")


def missing_tools() -> list[str]:
    """What the fixture needs and this machine lacks (for a skip reason)."""
    missing = [] if binary() else ["docker-registry"]
    if shutil.which("skopeo") is None:
        missing.append("skopeo")
    missing += [name for name in ("bcrypt", "oras") if importlib.util.find_spec(name) is None]
    return missing


class Registry:
    """One registry and its storage under ``root``; ``start()`` it, ``stop()`` it (or ``with``).

    ``token_requests`` holds the query (``service``, ``scope``, ...) of every request the token
    endpoint got, but for those of the fixture's own pushes, so a spec sees its client's alone.
    """

    username = "puller"
    password = "s3cret-pw"
    service = "registry.test"  # the token's audience, as the registry's challenge names it
    issuer = "token-issuer.test"

    def __init__(
        self,
        root: Path,
        *,
        auth: str = "none",
        tls: bool = False,
        blob_redirect: str | None = None,
        bind: str = "127.0.0.1",
    ) -> None:
        if auth not in ("none", "basic", "token"):
            raise ValueError(f"auth must be none, basic or token, not {auth!r}")
        self.root = root
        self.auth = auth
        self.tls = tls
        self.port = free_port()
        self.bind = bind  # another host address for containers on a bridge network to reach
        self.host = f"{bind}:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.host}"
        self.storage = root / "storage"
        self.ca_file: Path | None = root / "ca.pem" if tls else None
        self.log_file = root / "registry.log"
        self.realm: str | None = None  # the token endpoint's URL, once started
        self.token_requests: list[dict[str, str]] = []
        self.token_lifetime = 300  # seconds each token the endpoint issues is valid for
        self.public = False  # token auth: anonymous clients get tokens too (as Docker Hub's do)
        # Blob GETs answered with a redirect to this base URL + the blob's storage path (the
        # redirect middleware, as a registry on object storage redirects to presigned URLs).
        self.blob_redirect = blob_redirect
        self._proc: subprocess.Popen[bytes] | None = None
        self._token_server: ThreadingHTTPServer | None = None
        self._token_thread: threading.Thread | None = None
        self._signing_key: Any = None
        self._x5c = ""

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Registry:
        executable = binary()
        if executable is None:
            raise RuntimeError("docker-registry is not installed (apt-get install docker-registry)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        config = self._config()
        config_file = self.root / "config.yml"
        config_file.write_text(json.dumps(config, indent=2))  # JSON is YAML
        with self.log_file.open("ab") as log:
            self._proc = subprocess.Popen(
                [executable, "serve", str(config_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},  # no REGISTRY_* overrides
            )
        try:
            wait_for_port(self.port, 20, "docker-registry", self.bind)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {self.log_file.read_text()[-2000:]}") from None
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._token_server is not None:
            self._token_server.shutdown()
            self._token_server.server_close()
            self._token_server = None
        if self._token_thread is not None:
            self._token_thread.join(timeout=10)
            self._token_thread = None

    def _config(self) -> dict[str, Any]:
        http: dict[str, Any] = {"addr": self.host, "secret": secrets.token_hex(16)}
        if self.tls:
            assert self.ca_file is not None
            cert, key = self.root / "registry.pem", self.root / "registry-key.pem"
            ca_signed(self.ca_file, cert, key)
            http["tls"] = {"certificate": str(cert), "key": str(key)}
        config: dict[str, Any] = {
            "version": "0.1",
            "log": {"level": "error", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage)},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": http,
        }
        if self.blob_redirect:
            redirect = {"name": "redirect", "options": {"baseurl": self.blob_redirect}}
            config["middleware"] = {"storage": [redirect]}
        if self.auth == "basic":
            config["auth"] = {"htpasswd": {"realm": "test-registry", "path": self._htpasswd()}}
        elif self.auth == "token":
            config["auth"] = {"token": self._start_token_server()}
        return config

    def _htpasswd(self) -> str:
        import bcrypt

        # cost 4, the least bcrypt takes: the registry checks the hash on every request
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=4)).decode()
        path = self.root / "htpasswd"
        path.write_text(f"{self.username}:{hashed}\n")
        return str(path)

    # -- token auth ------------------------------------------------------------------------------

    def _start_token_server(self) -> dict[str, str]:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        cert_file, key_file = self.root / "token-signer.pem", self.root / "token-signer-key.pem"
        self_signed(cert_file, key_file)
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self._signing_key = serialization.load_pem_private_key(key_file.read_bytes(), None)

        server = ThreadingHTTPServer(("127.0.0.1", 0), _token_handler(self))
        server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.root / "registry.pem", self.root / "registry-key.pem")
            server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https" if self.tls else "http"
        self.realm = f"{scheme}://127.0.0.1:{server.server_address[1]}/token"
        self._token_server = server
        self._token_thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._token_thread.start()
        return {
            "realm": self.realm,
            "service": self.service,
            "issuer": self.issuer,
            "rootcertbundle": str(cert_file),
        }

    def mint_token(self, scopes: list[str], *, lifetime: int = 300) -> str:
        """A JWT the registry accepts, granting what ``scopes`` ask (``repository:NAME:pull``)."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        if self._signing_key is None:
            raise RuntimeError("mint_token needs auth='token' and a started registry")
        access = []
        for scope in " ".join(scopes).split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind and name:
                granted = [a for a in actions.split(",") if a in GRANTABLE]
                access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        claims = {
            "iss": self.issuer,
            "sub": self.username,
            "aud": self.service,
            "exp": now + lifetime,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(12),
            "access": access,
        }
        signing_input = f"{_b64url(json.dumps(header))}.{_b64url(json.dumps(claims))}"
        signature = self._signing_key.sign(
            signing_input.encode(), padding.PKCS1v15(), hashes.SHA256()
        )
        return f"{signing_input}.{_b64url(signature)}"

    def _token_scope(self, scopes: str) -> str:
        """A token for ``scopes`` fetched from the token endpoint, as a client would."""
        assert self.realm is not None
        query = urlencode({"service": self.service, "scope": scopes})
        status, _, body = self._call("GET", f"{self.realm}?{query}", {"Authorization": _basic()})
        assert status == 200, body
        return json.loads(body)["token"]

    # -- talking to it ---------------------------------------------------------------------------

    def ref(self, repo_and_tag: str) -> str:
        return f"{self.host}/{repo_and_tag}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A context trusting ``ca_file`` (None over plain http)."""
        if self.ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.ca_file))

    def auth_headers(self, path: str, method: str = "GET") -> dict[str, str]:
        """The Authorization a legitimate client would send for ``path`` (``/v2/REPO/...``)."""
        if self.auth == "basic":
            return {"Authorization": _basic()}
        if self.auth == "token":
            match = re.match(r"/v2/(.+?)/(?:manifests|blobs|tags)/", path)
            actions = "pull" if method in ("GET", "HEAD") else "pull,push,delete"
            scopes = [f"repository:{match.group(1)}:{actions}"] if match else []
            return {"Authorization": f"Bearer {self.mint_token(scopes)}"}
        return {}

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        *,
        body: bytes | None = None,
        authorized: bool = True,
    ) -> tuple[int, dict[str, str], bytes]:
        """``method path`` (``/v2/...``) as the account (or anonymously): status, headers, body.

        Token auth mints its token here (not through the endpoint), so ``token_requests`` lists
        only what other clients asked for.
        """
        sent = {**(self.auth_headers(path, method) if authorized else {}), **(headers or {})}
        return self._call(method, self.url + path, sent, body)

    def _call(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.ssl_context()) as answer:
                return answer.status, dict(answer.headers.items()), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), exc.read()

    def manifest(self, target: str, accept: str = ANY_MANIFEST) -> tuple[dict, str]:
        """GET ``target``'s manifest (``repo:tag`` or ``repo@digest``): its JSON and digest."""
        repo, reference = _split(target)
        status, headers, body = self.request(
            "GET", f"/v2/{repo}/manifests/{reference}", {"Accept": accept}
        )
        if status != 200:
            raise RuntimeError(f"GET manifest {target}: {status} {body[:500]!r}")
        return json.loads(body), headers["Docker-Content-Digest"]

    def digest(self, target: str) -> str:
        """What the registry says ``target``'s manifest digest is (a HEAD of it)."""
        repo, reference = _split(target)
        status, headers, body = self.request(
            "HEAD", f"/v2/{repo}/manifests/{reference}", {"Accept": ANY_MANIFEST}
        )
        if status != 200:
            raise RuntimeError(f"HEAD manifest {target}: {status} {body[:500]!r}")
        return headers["Docker-Content-Digest"]

    # -- pushing ---------------------------------------------------------------------------------

    def push_files(self, target: str, folder: Path, names: list[str]) -> str:
        """Push ``names`` (files or folders under ``folder``) with oras-py; the manifest digest.

        Each layer's title is the name as given (``weights/model.bin``), as the oras CLI run in
        ``folder`` records it; oras-py itself would write only the base name, so an annotation
        file puts the full name back. A folder becomes oras-py's ``tar+gzip`` layer titled with
        its base name, its members under that name; unlike the oras CLI, oras-py adds no
        ``io.deis.oras.content.unpack`` annotation (write that layout by hand if a spec needs it).
        The config is oras-py's ``{}`` of type ``application/vnd.unknown.config.v1+json``.
        """
        from oras.client import OrasClient

        work = self.root / "oras"
        work.mkdir(exist_ok=True)
        number = next(_pushes)
        annotations = work / f"annotations-{number}.json"
        annotations.write_text(
            json.dumps(
                {str(folder / name): {TITLE: name} for name in names if (folder / name).is_file()}
            )
        )
        docker_config = work / "config.json"  # login writes here, never to ~/.docker
        if not docker_config.exists():
            docker_config.write_text('{"auths": {}}')
        verify: bool | str = str(self.ca_file) if self.ca_file is not None else True
        client = OrasClient(
            hostname=self.host,
            insecure=not self.tls,
            tls_verify=verify,
            auth_backend="basic" if self.auth == "basic" else "token",
        )
        if self.auth != "none":
            client.login(
                self.username, self.password, hostname=self.host, config_path=str(docker_config)
            )
        before = len(self.token_requests)
        if self.auth == "token":
            # oras-py keeps the first token it gets: its HEAD of a blob asks for pull only, and it
            # then answers the push's 401 with that token again. Ask the endpoint for both first.
            scope = f"repository:{_split(target)[0]}:pull,push"
            client.auth.set_token_auth(self._token_scope(scope))
        response = client.push(
            target=self.ref(target),
            files=[str(folder / name) for name in names],
            disable_path_validation=True,
            annotation_file=str(annotations),
            config_path=str(docker_config),
            quiet=True,
        )
        del self.token_requests[before:]
        if response.status_code not in (200, 201):
            raise RuntimeError(f"oras push {target}: {response.status_code} {response.text}")
        return self.digest(target)

    def push_layout(self, layout: Path, target: str, *, all_platforms: bool = False) -> str:
        """``skopeo copy`` an OCI image layout to ``target``; the digest the registry then has.

        Digests are preserved (``--preserve-digests``): skopeo would otherwise gzip uncompressed
        layers on the way. Without ``all_platforms`` skopeo picks this machine's platform from an
        index; with it, the whole index is pushed.
        """
        tmp = self.root / "skopeo" / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        registries_conf = self.root / "skopeo" / "registries.conf"
        registries_conf.write_text("unqualified-search-registries = []\n")
        argv = ["skopeo", "copy", "--insecure-policy", "--quiet", "--preserve-digests"]
        if all_platforms:
            argv.append("--all")
        if self.ca_file is not None:
            cert_dir = self.root / "skopeo" / "certs"
            cert_dir.mkdir(exist_ok=True)
            shutil.copyfile(self.ca_file, cert_dir / "ca.crt")
            argv.append(f"--dest-cert-dir={cert_dir}")
        else:
            argv.append("--dest-tls-verify=false")
        if self.auth != "none":
            argv.append(f"--dest-creds={self.username}:{self.password}")
        argv += [f"oci:{layout}", f"docker://{self.ref(target)}"]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root / "skopeo"),
            "TMPDIR": str(tmp),
            "REGISTRY_AUTH_FILE": str(self.root / "skopeo" / "auth.json"),
            "CONTAINERS_REGISTRIES_CONF": str(registries_conf),
            "REGISTRIES_CONFIG_PATH": str(registries_conf),
        }
        before = len(self.token_requests)
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
        )
        del self.token_requests[before:]
        if done.returncode:
            raise RuntimeError(f"skopeo copy to {target} failed: {done.stderr.strip()}")
        return self.digest(target)

    # -- breaking it -----------------------------------------------------------------------------

    def blob_file(self, repo: str, digest: str) -> Path:
        """Where the registry keeps blob ``digest`` of ``repo`` on disk."""
        algorithm, _, hexdigest = digest.partition(":")
        v2 = self.storage / "docker" / "registry" / "v2"
        links = [
            v2 / "repositories" / repo / kind / algorithm / hexdigest / "link"
            for kind in ("_layers", "_manifests/revisions")
        ]
        if not any(link.exists() for link in links):
            raise FileNotFoundError(f"{repo} has no blob {digest}")
        return v2 / "blobs" / algorithm / hexdigest[:2] / hexdigest / "data"

    def put_blob_bytes(self, repo: str, digest: str, data: bytes) -> None:
        """Make the registry serve ``data`` as blob ``digest`` (whatever its hash)."""
        self.blob_file(repo, digest).write_bytes(data)


def _token_handler(registry: Registry) -> type[BaseHTTPRequestHandler]:
    class TokenHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path != "/token":
                self._send(404, {"details": "not found"})
                return
            params = parse_qs(url.query, keep_blank_values=True)
            registry.token_requests.append({k: " ".join(v) for k, v in params.items()})
            anonymous = self.headers.get("Authorization") is None
            if (
                not (anonymous and registry.public)
                and self.headers.get("Authorization") != _basic()
            ):
                self._send(401, {"details": "credentials required"}, basic=True)
                return
            lifetime = registry.token_lifetime
            token = registry.mint_token(params.get("scope", []), lifetime=lifetime)
            self._send(200, {"token": token, "access_token": token, "expires_in": lifetime})

        def _send(self, status: int, payload: dict[str, Any], basic: bool = False) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if basic:
                self.send_header("WWW-Authenticate", 'Basic realm="token"')
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return TokenHandler


def _basic() -> str:
    pair = f"{Registry.username}:{Registry.password}".encode()
    return "Basic " + base64.b64encode(pair).decode()


def _b64url(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _split(target: str) -> tuple[str, str]:
    """``repo:tag`` or ``repo@sha256:...`` → (repo, tag or digest)."""
    if "@" in target:
        repo, _, digest = target.partition("@")
        return repo, digest
    repo, _, tag = target.rpartition(":")
    if not repo or "/" in tag:
        return target, "latest"
    return repo, tag


# -- OCI image layouts, by hand ------------------------------------------------------------------


def tar_bytes(
    entries: dict[str, bytes | None],
    *,
    gzip: bool = False,
    links: dict[str, str] | None = None,
    symlinks: dict[str, str] | None = None,
    order: list[str] | None = None,
) -> bytes:
    """A tar of exactly these members, names as given (``.wh.x``, ``../evil`` stay as they are).

    ``entries``: name → bytes (a file) or None (a folder); ``links``/``symlinks``: name → target.
    Members come in the order given, ``entries`` first, then ``symlinks``, then ``links``;
    ``order`` (every name once) sets another. Owners, modes and mtimes are fixed.
    """
    members: dict[str, tarfile.TarInfo] = {}
    data: dict[str, bytes] = {}
    for name, content in entries.items():
        info = tarfile.TarInfo(name)
        if content is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
        else:
            info.size, info.mode = len(content), 0o644
            data[name] = content
        members[name] = info
    for kind, given in ((tarfile.SYMTYPE, symlinks), (tarfile.LNKTYPE, links)):
        for name, target in (given or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, target, 0o777
            members[name] = info
    if order is not None:
        if sorted(order) != sorted(members):
            raise ValueError("order must name every member once")
        members = {name: members[name] for name in order}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, info in members.items():
            info.mtime, info.uid, info.gid, info.uname, info.gname = _MTIME, 0, 0, "root", "root"
            tar.addfile(info, io.BytesIO(data[name]) if name in data else None)
    raw = buffer.getvalue()
    return gz.compress(raw, mtime=0) if gzip else raw


def write_layout(
    layout: Path,
    layers: list[bytes],
    *,
    layer_media_type: str = "application/vnd.oci.image.layer.v1.tar",
    config_media_type: str = "application/vnd.oci.image.config.v1+json",
    annotations: list[dict[str, str]] | None = None,
    platforms: list[str] | None = None,
    artifact_type: str | None = None,
) -> str:
    """Write an OCI image layout of one manifest whose layers are ``layers`` (bytes as given);
    the digest of what its ``index.json`` points at.

    ``annotations``: one dict per layer. An image config (``config_media_type`` an image
    config's) is a valid minimal one, its diff_ids the sha256 of each layer uncompressed;
    any other config is ``{}``. With ``platforms`` (``["linux/amd64", "linux/arm64"]``) it
    points at an image index of one manifest per platform, each with one more layer: a tar of
    ``models/platform.txt`` (in the folder a modelcar keeps) holding the platform string, so a
    spec can tell which one was pulled.
    """
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    if annotations is not None and len(annotations) != len(layers):
        raise ValueError("annotations needs one dict per layer")

    def blob(media_type: str, content: bytes, **extra: Any) -> dict[str, Any]:
        hexdigest = hashlib.sha256(content).hexdigest()
        (blobs / hexdigest).write_bytes(content)
        found = {"mediaType": media_type, "digest": f"sha256:{hexdigest}", "size": len(content)}
        return found | extra

    def image(platform: dict[str, str], contents: list[bytes], notes: list[dict[str, str]]) -> Any:
        if config_media_type in IMAGE_CONFIGS:
            diff_ids = [_diff_id(layer, layer_media_type) for layer in contents]
            config = {**platform, "rootfs": {"type": "layers", "diff_ids": diff_ids}}
            config_bytes = json.dumps(config).encode()
        else:
            config_bytes = b"{}"
        manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": OCI_MANIFEST}
        if artifact_type is not None:
            manifest["artifactType"] = artifact_type
        manifest["config"] = blob(config_media_type, config_bytes)
        manifest["layers"] = [
            blob(layer_media_type, content, **({"annotations": note} if note else {}))
            for content, note in zip(contents, notes, strict=True)
        ]
        return manifest

    notes = annotations or [{} for _ in layers]
    if platforms is None:
        top = blob(OCI_MANIFEST, _json(image(_platform("linux/amd64"), layers, notes)))
    else:
        entries = []
        for name in platforms:
            marker = compressed(tar_bytes({"models/platform.txt": name.encode()}), layer_media_type)
            manifest = image(_platform(name), [*layers, marker], [*notes, {}])
            entries.append(blob(OCI_MANIFEST, _json(manifest), platform=_platform(name)))
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
        top = blob(OCI_INDEX, _json(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (layout / "index.json").write_bytes(
        _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [top]})
    )
    return top["digest"]


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=2).encode()


def _platform(name: str) -> dict[str, str]:
    os_name, architecture, *variant = name.split("/")
    found = {"architecture": architecture, "os": os_name}
    return found | ({"variant": variant[0]} if variant else {})


def compressed(data: bytes, media_type: str) -> bytes:
    """A layer's bytes as its media type says they are stored (+gzip, +zstd, or as they are)."""
    if media_type.endswith("+gzip"):
        return gz.compress(data, mtime=0)
    if media_type.endswith("+zstd"):
        from backports import zstd

        return zstd.compress(data)
    return data


def _diff_id(layer: bytes, media_type: str) -> str:
    """sha256 of the layer uncompressed (of the bytes as they are, if they don't decompress)."""
    raw = layer
    try:
        if media_type.endswith("+gzip"):
            raw = gz.decompress(layer)
        elif media_type.endswith("+zstd"):
            from backports import zstd

            raw = zstd.decompress(layer)
    except Exception:
        raw = layer
    return "sha256:" + hashlib.sha256(raw).hexdigest()
