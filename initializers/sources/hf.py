"""hf:// — Hugging Face Hub repos (models, datasets), listed as huggingface_hub lists them.

huggingface_hub parses the URI (``hf://[datasets/]org/repo[@rev][/path]``); the revision is
resolved to a commit and the tree listed by the calls ``HfApi`` makes, over this source's own
connection pool (:mod:`initializers.sources.hubapi`), and the library's status check raises
typed errors for private, gated and missing repos. Bytes come from the ``resolve`` URL pinned
to that commit, over the native byte path (:mod:`initializers.native`: small files requested
ahead of the workers, ranges read by them), or over the urllib3 transport
(:mod:`initializers.transport`) where rustls refuses a certificate the CA bundle vouches for.
Either way redirects to the CDN (or, for Xet-backed files on the real Hub, to its HTTP bridge)
are followed and the token is never sent to another host.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, Self
from urllib.parse import quote, urlsplit

from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import (
    DisabledRepoError,
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HfUriError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import parse_hf_uri

from initializers import __version__
from initializers.errors import (
    AuthError,
    NotFoundError,
    UsageError,
)
from initializers.fsutil import UnsafePathError, safe_relpath
from initializers.httpstatus import check_status, is_transient, transient
from initializers.native import NativeHttp, Streamed, read_roots
from initializers.options import SourceSettings
from initializers.sources.base import Checksum, Listing, Order, RemoteFile, Skipped, Source
from initializers.sources.hubapi import HubApi, HubFile
from initializers.sources.paging import PAGE_END, PageEnd, paged_listing, resumable
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)
DEFAULT_ENDPOINT = "https://huggingface.co"
_DEFAULT_REPO_TYPE = {"dataset": "dataset", "model": "model"}


def _disable_telemetry() -> None:
    """Keep huggingface_hub's requests to the repo's own.

    Unless telemetry is off, its user agent is built by probing for torch and by fetching an
    "agent harness" registry from the endpoint before the first API call (cached a day in
    HF_HOME, which a pod starts without): one more request, with a 3 s timeout, on every run.
    The initializers send no telemetry, as the images already said with HF_HUB_DISABLE_TELEMETRY.
    """
    hub_constants.HF_HUB_DISABLE_TELEMETRY = True


class HfSource(Source):
    """Files of one Hub repo at one commit, optionally under one folder or a single file."""

    def __init__(self, location: str, settings: SourceSettings):
        try:
            uri = parse_hf_uri(f"hf://{location}")
        except HfUriError as exc:
            raise UsageError(
                f"{exc.msg.rstrip('.')} in hf://{location}; expected "
                "hf://[datasets/]org/repo[@revision][/path]"
            ) from None
        if uri.type not in ("model", "dataset", "space"):
            raise UsageError(
                f"hf://{location}: {uri.type} URIs are not supported; use a model or dataset repo"
            )
        self.repo_id = uri.id
        # Without an explicit type, the dataset initializer means a dataset repo, as upstream.
        explicit = location.split("/", 1)[0] in ("models", "datasets", "spaces")
        self.repo_type = uri.type if explicit else _DEFAULT_REPO_TYPE[settings.kind]
        self._type_inferred = not explicit
        self.revision = settings.revision or uri.revision or "main"
        self.path = uri.path_in_repo.strip("/")
        self.settings = settings
        self.retry = settings.retry
        self.endpoint = (settings.hf_endpoint or DEFAULT_ENDPOINT).rstrip("/")
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"HF_ENDPOINT {self.endpoint!r} is not an http(s):// URL")
        _disable_telemetry()
        roots = read_roots(settings.ca_bundle)
        self._transport = HttpTransport.for_settings(settings)
        self._api = HubApi(
            self.endpoint,
            self.repo_type,
            self.repo_id,
            settings.token,
            __version__,
            self._transport,
            self.describe(),
        )
        headers = {"User-Agent": f"kf-initializers/{__version__}"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        self._headers = headers
        self._native = NativeHttp(
            self.endpoint, headers=headers, timeout=settings.timeout, roots=roots
        )
        self._commit: str | None = None
        self._gated = False

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        return cls(location, settings)

    def describe(self) -> str:
        kind = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        path = f"/{self.path}" if self.path else ""
        return f"hf://{kind}{self.repo_id}@{self.revision}{path}"

    # -- listing --------------------------------------------------------------------------------

    def list(self) -> Listing:
        self._commit, self._gated = self._call(lambda: self._api.revision(self.revision))
        entries = resumable(self._entries, self._call)
        listing = paged_listing(self._commit, map(self._entry, entries), Order.TREE)
        if not listing.files and not listing.skipped:
            raise NotFoundError(f"{self.describe()} holds no files")
        return listing

    def _entry(self, entry: HubFile | PageEnd) -> RemoteFile | Skipped | PageEnd:
        """A file of the tree, or its name and why it is refused.

        Every file keeps its path in the repository, sub-path or not: upstream downloads the
        whole repo with its layout, and the Kubeflow SDK's TorchTune trainer then reads
        /workspace/dataset/<sub-path> (as `hf download --include` lays it out too)."""
        if entry is PAGE_END:
            return entry
        try:
            return self._remote(safe_relpath(entry.path), entry)
        except UnsafePathError as exc:
            return entry.path, str(exc)

    def _entries(self) -> Iterator[HubFile | PageEnd]:
        commit = self._commit or ""
        if self.path:
            found = self._api.path_info(commit, self.path)
            if not found:
                raise NotFoundError(
                    f"{self.describe()}: no file or folder {self.path!r} in the "
                    "repo at that revision"
                )
            if isinstance(found, HubFile):
                yield found
                return
        for files, last in self._api.tree_pages(commit, self.path):
            yield from files
            if not last:
                yield PAGE_END

    def _remote(self, relative: str, entry: HubFile) -> RemoteFile:
        if entry.sha256 is not None:
            return RemoteFile(
                relative, entry.size, entry.sha256, Checksum("sha256", entry.sha256), entry.path
            )
        return RemoteFile(
            relative, entry.size, entry.blob_id, Checksum("git-sha1", entry.blob_id), entry.path
        )

    # -- fetching -------------------------------------------------------------------------------

    def _resolve_path(self, file: RemoteFile) -> str:
        """The file's ``resolve`` path under the endpoint, pinned to the listed commit."""
        kind = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        commit = quote(self._commit or "", safe="")
        return f"{kind}{self.repo_id}/resolve/{commit}/{quote(file.locator, safe='/')}"

    fetches_whole = True

    @contextlib.asynccontextmanager
    async def fetch_whole(self, file: RemoteFile) -> AsyncIterator[Streamed]:
        """A small file over the native path (the engine's ``wholefiles``)."""
        with self._gated_refusal():
            async with self._native.get_whole(
                self._resolve_path(file), file.size, file.path
            ) as body:
                yield body

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        whole = start == 0 and end == file.size
        with self._gated_refusal():
            return self._native.open_range_or_urllib3(
                self._transport, self._resolve_path(file), {}, start, end, file.path, whole
            )

    @contextlib.contextmanager
    def _gated_refusal(self) -> Iterator[None]:
        """A refused download of a gated repo's file says why: the Hub lists gated repos
        freely and refuses only the bytes."""
        try:
            yield
        except AuthError:
            if self._gated:
                raise AuthError(self._gated_message()) from None
            raise

    def check_access(self, file: RemoteFile) -> None:
        """A HEAD of the file's resolve URL: the Hub refuses it as it refuses the GET."""
        url = f"{self.endpoint}/{self._resolve_path(file)}"
        status, headers, _ = self._transport.request("HEAD", url, self._headers, file.path)
        if status in (401, 403) and self._gated:
            raise AuthError(self._gated_message())
        check_status(status, f"{self.describe()}: {file.path}", headers)

    def _repo_url(self) -> str:
        kind = "" if self.repo_type == "model" else f"{self.repo_type}s/"
        return f"{self.endpoint}/{kind}{self.repo_id}"

    def _gated_message(self) -> str:
        return (
            f"{self.describe()} is gated: accept its conditions at {self._repo_url()} with "
            "your account, then pass that account's token (ACCESS_TOKEN or HF_TOKEN)"
        )

    def close(self) -> None:
        self._native.close()
        self._transport.close()

    # -- errors ---------------------------------------------------------------------------------

    def _call(self, fn: Any) -> Any:
        return self.retry.call(lambda: self._map_errors(fn), self.describe())

    def _map_errors(self, fn: Any) -> Any:
        where = self.describe()
        try:
            return fn()
        except GatedRepoError:
            raise AuthError(self._gated_message()) from None
        except RepositoryNotFoundError:
            hints = [
                "the token may lack access to it"
                if self.settings.token
                else "if it is private, pass a token (ACCESS_TOKEN or HF_TOKEN)"
            ]
            if self._type_inferred:
                other = "model" if self.repo_type == "dataset" else "dataset"
                hints.append(
                    f"it was looked up as a {self.repo_type} repo; for a {other} repo "
                    f"write hf://{other}s/{self.repo_id}"
                )
            raise NotFoundError(
                f"{where}: repository not found — check the name; {'; '.join(hints)}"
            ) from None
        except RevisionNotFoundError:
            raise NotFoundError(
                f"{where}: revision {self.revision!r} does not exist — use a "
                "branch, tag or commit of the repo"
            ) from None
        except EntryNotFoundError:
            raise NotFoundError(
                f"{where}: path {self.path!r} does not exist at that revision"
            ) from None
        except DisabledRepoError:
            raise NotFoundError(f"{where}: the repository is disabled on the Hub") from None
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status in (401, 403):
                raise AuthError(
                    f"{where}: access denied (HTTP {status}); check the token "
                    "(ACCESS_TOKEN or HF_TOKEN)"
                ) from None
            if is_transient(status):
                raise transient(
                    f"{where}: the Hub answered HTTP {status}", exc.response.headers
                ) from None
            raise UsageError(f"{where}: the Hub refused the request (HTTP {status})") from None
