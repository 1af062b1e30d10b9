"""Who we are to a registry: credentials found as Docker and podman find them, and the
challenge a registry answers with (``WWW-Authenticate``), answered.

Credentials, first found wins: ``OCI_USERNAME``/``OCI_PASSWORD``; a Docker config's JSON in
``OCI_DOCKERCONFIGJSON`` (or ``.dockerconfigjson``, the name ``envFrom: secretRef`` gives an
imagePullSecret's key); the file ``REGISTRY_AUTH_FILE`` (podman's); ``$DOCKER_CONFIG/config.json``;
``~/.docker/config.json``. Else the registry is asked anonymously. Credential helpers
(``credsStore``, ``credHelpers``) are not run: an initializer has none of them.

A registry says how it wants them on its first 401: ``Basic`` takes the pair on every request;
``Bearer realm=…,service=…,scope=…`` a token from the realm (asked for with the pair, or
anonymously, for a public repository), sent until a 401 says it expired, then asked for again.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from initializers.errors import AuthError, UsageError
from initializers.httpstatus import status_error
from initializers.options import SourceSettings
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)

_PARAM = re.compile(r'(\w+)="([^"]*)"')
CREDENTIALS_HINT = (
    "set OCI_USERNAME and OCI_PASSWORD, give an imagePullSecret's .dockerconfigjson in "
    "OCI_DOCKERCONFIGJSON, or point REGISTRY_AUTH_FILE or DOCKER_CONFIG at a Docker config"
)
_DOCKER_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Login:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()


def find_login(registry: str, settings: SourceSettings) -> Login | None:
    """The credentials for ``registry`` (host[:port]), first found wins; None: anonymous."""
    if settings.anonymous:
        return None
    if settings.oci_username or settings.oci_password:
        if not (settings.oci_username and settings.oci_password):
            raise UsageError("give both OCI_USERNAME and OCI_PASSWORD, or neither")
        return Login(settings.oci_username, settings.oci_password)
    if settings.oci_docker_config_json:
        found = _from_config(settings.oci_docker_config_json, registry, "OCI_DOCKERCONFIGJSON")
        if found is not None:
            return found
    for path in _config_files(settings):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UsageError(f"cannot read the registry credentials file {path}: {exc}") from None
        found = _from_config(text, registry, str(path))
        if found is not None:
            return found
    return None


def _config_files(settings: SourceSettings) -> list[Path]:
    files = []
    if settings.oci_auth_file:
        files.append(Path(settings.oci_auth_file))
    if settings.oci_docker_config:
        files.append(Path(settings.oci_docker_config) / "config.json")
    files.append(Path.home() / ".docker" / "config.json")
    return files


def _from_config(text: str, registry: str, where: str) -> Login | None:
    """The login a Docker config (``{"auths": {...}}``, or the older bare map) holds for
    ``registry``; UsageError when it is not such a config."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(
            f"{where} is not a Docker config (JSON such as "
            '{"auths": {"registry.example.com": {"auth": "<base64 user:password>"}}})'
        ) from None
    if not isinstance(config, dict):
        raise UsageError(f"{where} is not a Docker config (a JSON object with auths)")
    auths = config.get("auths", config if "auths" not in config else {})
    names = _DOCKER_HUB_NAMES if registry in _DOCKER_HUB_NAMES else (registry,)
    for key, entry in (auths or {}).items():
        if _registry_of(key) in names and isinstance(entry, dict):
            return _login_of(entry, where)
    helpers = config.get("credHelpers") or {}
    if any(name in helpers for name in names) or config.get("credsStore"):
        log.warning(
            "%s names a credential helper for %s; helpers are not run here: put the "
            "credentials under auths, or use OCI_USERNAME and OCI_PASSWORD",
            where,
            registry,
        )
    return None


def _registry_of(key: str) -> str:
    """``https://host:port/v1/`` or ``host:port`` → ``host:port``."""
    return urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]


def _login_of(entry: Mapping[str, object], where: str) -> Login | None:
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            username, colon, password = base64.b64decode(auth).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            colon = ""
        if not colon:
            raise UsageError(f"{where}: an auths entry's auth is not base64 of user:password")
        return Login(username, password)
    username, password = entry.get("username"), entry.get("password")
    if isinstance(username, str) and isinstance(password, str) and username:
        return Login(username, password)
    if entry.get("identitytoken"):
        log.warning("%s: identity tokens are not supported; give a username and password", where)
    return None


class RegistryAuth:
    """The Authorization header for one repository's requests, renewed when refused."""

    def __init__(
        self,
        transport: HttpTransport,
        login: Login | None,
        repository: str,
        where: str,
        plain_http: bool,
    ) -> None:
        self._transport = transport
        self._login = login
        self._scope = f"repository:{repository}:pull"
        self._where = where
        self._plain_http = plain_http
        self._header = ""
        self._challenge: dict[str, str] | None = None  # the Bearer parameters, once asked
        self._lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        header = self._header
        return {"Authorization": header} if header else {}

    def refused(self, sent: Mapping[str, str], answer: Mapping[str, str] | None) -> None:
        """A request carrying ``sent`` got a 401 (with the answer's headers where the caller
        has them): get a better header, or raise AuthError when there is none to get."""
        with self._lock:
            if sent.get("Authorization", "") != self._header:
                return  # another request renewed it meanwhile
            challenge = (answer or {}).get("WWW-Authenticate", "")
            scheme, _, params = challenge.partition(" ")
            if scheme.lower() == "basic" or (not challenge and self._challenge is None):
                if self._login is None or self._header == self._login.basic():
                    raise self.denied()
                self._header = self._login.basic()
                return
            if scheme.lower() == "bearer":
                self._challenge = dict(_PARAM.findall(params))
            elif self._challenge is None:
                raise AuthError(
                    f"{self._where}: the registry asks for {scheme or 'an unknown'} "
                    "authentication, which is not supported (Basic and Bearer are)"
                )
            self._header = f"Bearer {self._token()}"

    def _token(self) -> str:
        """A token from the challenge's realm, for the scope the challenge names (else pull
        of this repository)."""
        assert self._challenge is not None
        realm = self._challenge.get("realm", "")
        parts = urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AuthError(f"{self._where}: the registry's token realm {realm!r} is not a URL")
        if parts.scheme == "http" and not self._plain_http:
            raise AuthError(
                f"{self._where}: the registry sends credentials to a plain-http token service "
                f"({parts.hostname}); name the registry in OCI_INSECURE_REGISTRIES to allow it"
            )
        query = {"scope": self._challenge.get("scope") or self._scope}
        if self._challenge.get("service"):
            query["service"] = self._challenge["service"]
        headers = {"Authorization": self._login.basic()} if self._login else {}
        url = f"{realm}{'&' if parts.query else '?'}{urlencode(query)}"
        status, answer, body = self._transport.request("GET", url, headers, self._where)
        if status in (401, 403):
            raise self.denied()
        failure = status_error(status, f"{self._where} (its token service)", answer)
        if failure is not None:
            raise failure
        try:
            document = json.loads(body)
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise AuthError(f"{self._where}: the registry's token service sent no token")
        return token

    def denied(self) -> AuthError:
        """What a request refused with the best header there is to send means."""
        if self._login is None:
            return AuthError(
                f"{self._where}: the registry gives no anonymous access to this repository (or "
                f"it does not exist: registries such as Docker Hub say so alike); "
                f"{CREDENTIALS_HINT}"
            )
        return self._wrong()

    def _wrong(self) -> AuthError:
        assert self._login is not None
        return AuthError(
            f"{self._where}: the registry refused the credentials of {self._login.username!r}; "
            "check the username and password (or token) and that they may pull this repository"
        )
