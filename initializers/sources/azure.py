"""az:// — Azure Blob Storage: listed with the Blob service's REST API, fetched over the transport.

``az://container/prefix`` takes the account from ``AZURE_STORAGE_ACCOUNT_NAME`` (or the
connection string); KServe's form ``https://ACCOUNT.blob.core.windows.net/container/prefix``
carries it in the host. Credentials, first found wins: ``--anonymous``; a connection string
(``AZURE_STORAGE_CONNECTION_STRING``, which may also name the endpoint, e.g. Azurite's); a SAS
token; an account key (``AZURE_STORAGE_ACCOUNT_KEY`` or KServe's ``AZURE_STORAGE_ACCESS_KEY``);
a service principal (``AZURE_CLIENT_ID``/``AZURE_TENANT_ID``/``AZURE_CLIENT_SECRET``, or
KServe's ``AZ_*``), AKS workload identity (``AZURE_FEDERATED_TOKEN_FILE``), a client certificate
or managed identity, through azure-identity (:mod:`~.azidentity`); else anonymous, for a public
container. Blobs are pinned to the ETag listed (``If-Match``) and verified against
their Content-MD5 when they have one, else by size.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol, Self
from urllib.parse import quote, urlencode, urlsplit

from initializers.errors import AuthError, NotFoundError, TransientError, UsageError
from initializers.httpstatus import range_value, status_error
from initializers.native import NativeHttp, read_roots
from initializers.options import SourceSettings
from initializers.sources.azauth import API_VERSION, SharedKey
from initializers.sources.azidentity import identity_configured
from initializers.sources.base import Checksum, Listing, RemoteFile, Source
from initializers.sources.prefix import Entry, list_prefix, split_location
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)

_CONTAINER = re.compile(r"^(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*$")
_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
PUBLIC_SUFFIX = ".blob.core.windows.net"
# Azurite's well-known development account (published in Microsoft's documentation).
DEV_ACCOUNT = "devstoreaccount1"
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
NO_CREDENTIALS_HINT = (
    "pass credentials: AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_SAS_TOKEN, "
    "AZURE_STORAGE_ACCOUNT_KEY, a service principal (AZURE_CLIENT_ID, AZURE_TENANT_ID, "
    "AZURE_CLIENT_SECRET), AKS workload identity, or --azure-managed-identity"
)


class Signer(Protocol):
    def headers(self, method: str, url: str, headers: Mapping[str, str]) -> dict[str, str]: ...


@dataclass(frozen=True)
class AzureLocation:
    account: str | None  # None: from the settings
    container: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> AzureLocation:
        parts = urlsplit(uri)
        account = None
        if parts.scheme in ("http", "https"):  # KServe's https://ACCOUNT.blob.core.windows.net/...
            account = (parts.hostname or "").removesuffix(PUBLIC_SUFFIX)
            path = parts.path.lstrip("/")
        else:
            path = uri.split("://", 1)[1]
        rule = "3-63 lowercase letters, digits and single hyphens"
        container, prefix = split_location("az", path, _CONTAINER, rule, noun="container")
        return cls(account, container, prefix)


class AzureSource(Source):
    """Blobs under ``az://container/prefix`` (on a ``/`` boundary), or one blob."""

    def __init__(self, location: AzureLocation, settings: SourceSettings) -> None:
        self.retry = settings.retry
        self._transport = HttpTransport.for_settings(settings)
        connection = _parse_connection_string(settings.azure_connection_string)
        account = location.account or connection.get("accountname") or settings.azure_account
        if not account:
            raise UsageError(
                "az:// needs the storage account: set AZURE_STORAGE_ACCOUNT_NAME, or give "
                "AZURE_STORAGE_CONNECTION_STRING, or use https://ACCOUNT.blob.core.windows.net/..."
            )
        if not _ACCOUNT.match(account) and "blobendpoint" not in connection:
            raise UsageError(f"{account!r} is not a valid Azure storage account name")
        self.location = AzureLocation(account, location.container, location.prefix)
        self._endpoint = (
            connection.get("blobendpoint") or f"https://{account}{PUBLIC_SUFFIX}"
        ).rstrip("/")
        self._signer, self._sas = _credentials(settings, connection, account)
        self._native = NativeHttp(
            self._endpoint,
            headers={},
            timeout=settings.timeout,
            roots=read_roots(settings.ca_bundle),
        )

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        uri = settings.storage_uri if "://" in settings.storage_uri else f"az://{location}"
        return cls(AzureLocation.parse(uri), settings)

    def describe(self) -> str:
        return f"az://{self.location.container}/{self.location.prefix}"

    # -- requests -------------------------------------------------------------------------------

    def _url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        pairs = urlencode(dict(query or {}))
        sas = self._sas
        joined = "&".join(part for part in (pairs, sas) if part)
        return f"{self._endpoint}{path}" + (f"?{joined}" if joined else "")

    def _headers(self, method: str, url: str, extra: Mapping[str, str]) -> dict[str, str]:
        headers = {"x-ms-version": API_VERSION, **extra}
        return self._signer.headers(method, url, headers) if self._signer else headers

    def _request(
        self, method: str, path: str, query: Mapping[str, str], what: str
    ) -> tuple[int, Mapping[str, str], bytes]:
        url = self._url(path, query)
        status, headers, body = self._transport.request(
            method, url, self._headers(method, url, {}), what
        )
        if status in (401, 403):
            code = headers.get("x-ms-error-code", f"HTTP {status}")
            hint = (
                NO_CREDENTIALS_HINT
                if self._signer is None and not self._sas
                else (
                    "check the key, SAS (its permissions and expiry) or the role assignment "
                    "(Storage Blob Data Reader)"
                )
            )
            raise AuthError(f"{self.describe()}: access denied ({code}); {hint}")
        return status, headers, body

    # -- listing --------------------------------------------------------------------------------

    def list(self) -> Listing:
        return list_prefix(
            self.location.prefix,
            where=self.describe(),
            retry=self.retry,
            list_folder=self._list_blobs,
            lookup=self._properties,
            remote=_remote,
            nouns=("blobs", "container"),
        )

    def _list_blobs(self, folder: str) -> Iterator[Entry]:
        marker = ""
        while True:
            query = {"restype": "container", "comp": "list", "prefix": folder}
            if marker:
                query["marker"] = marker
            root = self.retry.call(partial(self._list_page, query), self.describe())
            for blob in root.iter("Blob"):
                properties = {
                    child.tag: child.text or "" for child in blob.find("Properties") or ()
                }
                yield _entry(blob.findtext("Name", ""), properties)
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return

    def _list_page(self, query: Mapping[str, str]) -> ElementTree.Element:
        where, container = self.describe(), self.location.container
        status, headers, body = self._request("GET", f"/{container}", query, where)
        if status == 404:
            private = (
                "" if self._signer or self._sas else f"; if it is private, {NO_CREDENTIALS_HINT}"
            )
            raise NotFoundError(
                f"{where}: container {container!r} does not exist "
                f"in account {self.location.account!r}{private}"
            )
        failure = status_error(status, self.describe(), headers)
        if failure is not None:
            raise failure
        try:
            return ElementTree.fromstring(body)
        except ElementTree.ParseError:
            raise TransientError(f"{self.describe()}: the listing was not valid XML") from None

    def _properties(self, name: str) -> Entry | None:
        path = f"/{self.location.container}/{quote(name, safe='/~')}"
        status, headers, _ = self._request("HEAD", path, {}, name)
        if status == 404:
            return None
        failure = status_error(status, name, headers)
        if failure is not None:
            raise failure
        properties = {
            "Content-Length": headers.get("Content-Length", "0"),
            "Content-MD5": headers.get("Content-MD5", ""),
            "Etag": headers.get("ETag", ""),
        }
        return _entry(name, properties)

    # -- fetching -------------------------------------------------------------------------------

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        url = self._url(f"/{self.location.container}/{quote(file.locator, safe='/~')}")
        whole = start == 0 and end == file.size
        extra = {"If-Match": file.version} if file.version else {}
        if not whole:
            extra["Range"] = range_value(start, end)  # signed, so set here as the client will
        headers = self._headers("GET", url, extra)
        return self._native.open_range_or_urllib3(
            self._transport, url.removeprefix(self._endpoint), headers, start, end, file.path, whole
        )

    def close(self) -> None:
        self._native.close()
        self._transport.close()


def _entry(name: str, properties: Mapping[str, str]) -> Entry:
    return Entry(name, int(properties.get("Content-Length") or 0), properties)


def _remote(path: str, entry: Entry) -> RemoteFile:
    properties = entry.meta
    md5 = properties.get("Content-MD5", "")
    etag = properties.get("Etag", "").strip()
    if etag and not etag.startswith('"'):
        etag = f'"{etag}"'  # the listing's ETag is bare, the headers' quoted
    return RemoteFile(
        path=path,
        size=entry.size,
        version=etag or None,
        checksum=Checksum("md5-base64", md5) if md5 else None,
        locator=entry.key,
    )


def _parse_connection_string(text: str | None) -> dict[str, str]:
    """``Key=Value;...`` with lowercase keys; ``UseDevelopmentStorage=true`` means Azurite."""
    if not text:
        return {}
    fields: dict[str, str] = {}
    for part in text.strip().strip(";").split(";"):
        key, eq, value = part.partition("=")
        if not eq:
            raise UsageError(
                "AZURE_STORAGE_CONNECTION_STRING is not of the form Key=Value;Key=Value "
                "(copy it from the storage account's access keys)"
            )
        fields[key.strip().lower()] = value.strip()
    if fields.get("usedevelopmentstorage", "").lower() == "true":
        fields.setdefault("accountname", DEV_ACCOUNT)
        fields.setdefault("accountkey", DEV_KEY)
        fields.setdefault("blobendpoint", f"http://127.0.0.1:10000/{DEV_ACCOUNT}")
    if "blobendpoint" not in fields and "accountname" in fields:
        protocol = fields.get("defaultendpointsprotocol", "https")
        suffix = fields.get("endpointsuffix", "core.windows.net")
        fields["blobendpoint"] = f"{protocol}://{fields['accountname']}.blob.{suffix}"
    return fields


def _credentials(
    settings: SourceSettings, connection: Mapping[str, str], account: str
) -> tuple[Signer | None, str]:
    """(request signer or None, SAS query string or "") for the first credential found."""
    if settings.anonymous:
        return None, ""
    if "accountkey" in connection:
        return SharedKey(account, connection["accountkey"]), ""
    sas = connection.get("sharedaccesssignature") or settings.azure_sas
    if sas:
        return None, sas.lstrip("?")
    if settings.azure_key:
        return SharedKey(account, settings.azure_key), ""
    if identity_configured(settings):
        from initializers.sources.azidentity import IdentityToken  # azure-identity: only now

        return IdentityToken(settings), ""
    return None, ""
