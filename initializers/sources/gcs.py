"""gs:// — Google Cloud Storage: listed with the JSON API, fetched over the shared HTTP transport.

google-auth does what it is good at: Application Default Credentials in Google's order —
``GOOGLE_APPLICATION_CREDENTIALS`` (a key file), gcloud's user credentials, the GKE metadata
server (Workload Identity) — plus a key's JSON given in ``GOOGLE_APPLICATION_CREDENTIALS_JSON``
(what a TrainJob's ``secretRef`` turns into), refreshed before it expires. Its HTTP calls go
through :class:`_AuthRequest` on urllib3, so it needs neither ``requests`` nor its own transport.
``STORAGE_EMULATOR_HOST`` (Google's own convention) points everything at an emulator, where
requests are anonymous unless a key is given.

Every object's bytes are pinned to the generation listed (a replaced object fails the run with
exit 4 or 5 rather than mixing versions) and verified against every checksum the listing gives
that can be computed here: its crc32c and its md5Hash, both in the same pass (a composite
object has no md5Hash; crc32c needs awscrt). Objects are fetched as stored
(``Accept-Encoding: gzip``), so GCS's decompressive transcoding cannot change the bytes the
checksums cover.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Self
from urllib.parse import quote, urlencode

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport
import urllib3

from initializers import checksum as checksums
from initializers.errors import AuthError, NotFoundError, TransientError, UsageError
from initializers.httpstatus import status_error
from initializers.native import NativeHttp, read_roots
from initializers.options import SourceSettings
from initializers.sources.base import Checksum, Listed, Listing, RemoteFile, Source
from initializers.sources.paging import PAGE_END, PageEnd, split_pages
from initializers.sources.prefix import Entry, folder_of, list_prefix, split_location
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)

API = "https://storage.googleapis.com"
SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
KEY_ENV = "GOOGLE_APPLICATION_CREDENTIALS_JSON"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_FIELDS = "items(name,size,generation,crc32c,md5Hash),nextPageToken"


@dataclass(frozen=True)
class GcsLocation:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, location: str) -> GcsLocation:
        rule = "3-222 lowercase letters, digits, '.', '-', '_'"
        return cls(*split_location("gs", location, _BUCKET, rule))


class GcsSource(Source):
    """Objects under ``gs://bucket/prefix`` (on a ``/`` boundary), or one object."""

    def __init__(self, location: GcsLocation, settings: SourceSettings) -> None:
        self.location = location
        self.retry = settings.retry
        self._transport = HttpTransport.for_settings(settings)
        emulator = (settings.gcs_emulator or "").rstrip("/")
        if emulator and "://" not in emulator:
            emulator = "http://" + emulator
        self._api = emulator or API
        self._native = NativeHttp(
            self._api, headers={}, timeout=settings.timeout, roots=read_roots(settings.ca_bundle)
        )
        self._credentials = _credentials(settings, self._transport, bool(emulator))
        self._token_lock = threading.Lock()

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        return cls(GcsLocation.parse(location), settings)

    def describe(self) -> str:
        return f"gs://{self.location.bucket}/{self.location.prefix}"

    # -- credentials ----------------------------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        """The Authorization header, refreshing the token first when it is missing or expiring."""
        credentials = self._credentials
        if credentials is None:
            return {}
        with self._token_lock:
            if not credentials.valid:
                try:
                    credentials.refresh(_AuthRequest(self._transport))
                except google.auth.exceptions.TransportError as exc:
                    raise TransientError(f"GCS credentials: {exc}") from None
                except google.auth.exceptions.RefreshError as exc:
                    raise AuthError(
                        f"cannot get a GCS access token ({_first_line(exc)}); check the key or "
                        "the Workload Identity binding of the pod's service account"
                    ) from None
            return {"Authorization": f"Bearer {credentials.token}"}

    # -- listing --------------------------------------------------------------------------------

    def list(self) -> Listing:
        return list_prefix(
            self.location.prefix,
            where=self.describe(),
            retry=self.retry,
            list_folder=self._list_objects,
            lookup=self._object,
            remote=_remote,
        )

    def pages_after(self, after: str | None) -> Iterator[list[Listed]]:
        """The listing from ``startOffset``, which names the first key listed: the key
        ``after`` itself is dropped."""
        folder = folder_of(self.location.prefix)
        start = folder + after if after is not None else ""
        return (
            [
                (entry.key[len(folder) :], entry.size, _version(entry))
                for entry in page
                if entry.key != start
            ]
            for page in split_pages(self._list_objects(folder, start))
        )

    def _list_objects(self, folder: str, start: str = "") -> Iterator[Entry | PageEnd]:
        token: str | None = None
        while True:
            query = {"prefix": folder, "fields": _FIELDS, "maxResults": "1000"}
            if token:
                query["pageToken"] = token
            elif start:
                query["startOffset"] = start
            path = f"/storage/v1/b/{quote(self.location.bucket)}/o"
            page = self.retry.call(partial(self._get_json, path, dict(query)), self.describe())
            yield from (_entry(obj) for obj in page.get("items", []))
            token = page.get("nextPageToken")
            if not token:
                return
            yield PAGE_END

    def _object(self, name: str) -> Entry | None:
        path = f"/storage/v1/b/{quote(self.location.bucket)}/o/{quote(name, safe='')}"
        try:
            return _entry(self._get_json(path, {}))
        except NotFoundError:
            return None

    def _get_json(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        url = self._api + path + (f"?{urlencode(query)}" if query else "")
        status, headers, body = self._transport.request("GET", url, self._auth(), self.describe())
        if status == 404:
            raise NotFoundError(
                f"{self.describe()}: bucket {self.location.bucket!r} or object not found — "
                "check the bucket name and the prefix"
            )
        if status in (401, 403):
            raise AuthError(
                f"{self.describe()}: access denied (HTTP {status}); check the credentials and "
                "that they grant storage.objects.list and storage.objects.get on the bucket"
            )
        failure = status_error(status, self.describe(), headers)
        if failure is not None:
            raise failure
        try:
            return json.loads(body)
        except ValueError:
            raise TransientError(f"{self.describe()}: the listing was not valid JSON") from None

    # -- fetching -------------------------------------------------------------------------------

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        name = quote(file.locator, safe="")
        path = (
            f"/download/storage/v1/b/{quote(self.location.bucket)}/o/{name}"
            f"?alt=media&generation={file.version}"
        )
        headers = {**self._auth(), "Accept-Encoding": "gzip"}
        whole = start == 0 and end == file.size
        return self._native.open_range_or_urllib3(
            self._transport, path, headers, start, end, file.path, whole
        )

    def close(self) -> None:
        self._native.close()
        self._transport.close()


def _entry(obj: Mapping[str, Any]) -> Entry:
    return Entry(obj["name"], int(obj.get("size", 0)), obj)


def _version(entry: Entry) -> str | None:
    """An object's version as the manifest records it: its generation."""
    return str(entry.meta.get("generation", "")) or None


def _remote(path: str, entry: Entry) -> RemoteFile:
    obj = entry.meta
    return RemoteFile(
        path=path,
        size=entry.size,
        version=_version(entry),
        checksum=_checksum(obj),
        locator=entry.key,
    )


def _checksum(obj: Mapping[str, Any]) -> Checksum | None:
    """Every digest the object carries that can be computed here, as one checksum: a mismatch
    of any of them fails the file (a deliberate change can keep a CRC, not an MD5)."""
    listed = [
        (algorithm, obj[field])
        for field, algorithm in (("crc32c", "crc32c"), ("md5Hash", "md5-base64"))
        if obj.get(field) and checksums.is_supported(algorithm)
    ]
    return Checksum(*checksums.all_of(listed)) if listed else None


def _credentials(
    settings: SourceSettings, transport: HttpTransport, emulated: bool
) -> google.auth.credentials.Credentials | None:
    """The caller's credentials: None means anonymous requests."""
    if settings.anonymous:
        return None
    try:
        if settings.gcs_key_json:
            try:
                info = json.loads(settings.gcs_key_json)
            except ValueError:
                raise UsageError(
                    f"{KEY_ENV} is not valid JSON; paste the key file's content"
                ) from None
            credentials, _ = google.auth.load_credentials_from_dict(info, scopes=[SCOPE])
            return credentials
        if emulated and not settings.gcs_key_file:
            return None  # an emulator takes anonymous requests, as Google's libraries assume
        credentials, _ = google.auth.default(scopes=[SCOPE], request=_AuthRequest(transport))
        return credentials
    except google.auth.exceptions.DefaultCredentialsError as exc:
        detail = _first_line(exc)
        if "not found" in detail.lower() and "default credentials" in detail.lower():
            raise AuthError(
                "no GCS credentials found: set GOOGLE_APPLICATION_CREDENTIALS (a key file) or "
                f"{KEY_ENV} (the key itself), run on GKE with Workload Identity, or use "
                "--anonymous for a public bucket"
            ) from None
        raise UsageError(f"the GCS credentials cannot be used: {detail}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__


class _AuthResponse(google.auth.transport.Response):
    def __init__(self, status: int, headers: Mapping[str, str], data: bytes) -> None:
        self._status, self._headers, self._data = status, headers, data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    @property
    def data(self) -> bytes:
        return self._data


class _AuthRequest(google.auth.transport.Request):
    """google-auth's HTTP calls (token exchange, metadata server) on our urllib3 transport."""

    def __init__(self, transport: HttpTransport) -> None:
        self._transport = transport

    def __call__(  # type: ignore[override]
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _AuthResponse:
        try:
            status, response_headers, data = self._transport.request(
                method, url, dict(headers or {}), "GCS credentials", body=body, timeout=timeout
            )
        except (TransientError, urllib3.exceptions.HTTPError) as exc:
            raise google.auth.exceptions.TransportError(str(exc)) from None
        return _AuthResponse(status, response_headers, data)
