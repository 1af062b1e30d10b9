"""The three Hub API calls a fetch makes: sent as ``HfApi`` sends them, judged as it judges them.

Why not ``HfApi``: importing ``huggingface_hub.hf_api`` cost ~130 ms of every Hub run's start
(on top of this package's own imports), about 40% of its time to the first byte; the calls a
fetch needs are three GETs and a POST. Why not huggingface_hub's shared client either: building
it (httpcore's import, an httpx client, an SSL context loaded with certifi's roots, even for an
http:// endpoint) cost another ~45 ms, and it needed our timeouts and CA bundle patched into a
process-wide object. So the calls go over the source's own pool (:mod:`initializers.transport`:
its timeouts, CA bundle, proxies, as for every other source), with the same URLs, parameters and
headers (``build_hf_headers``) as ``HfApi``'s ``model_info`` / ``dataset_info`` with ``expand``,
``_iter_repo_tree_pages`` and ``get_paths_info``; an answer that is not 2xx goes to the
library's ``hf_raise_for_status``, so a missing repo, revision or path, a gated or disabled repo
raise the errors ``HfApi`` raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx2
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from initializers.transport import HttpTransport


@dataclass(frozen=True, slots=True)
class HubFile:
    """A file of a repo's tree: its path, size, git blob id, and an LFS file's sha256."""

    path: str
    size: int
    blob_id: str
    sha256: str | None


def hub_file(info: Mapping[str, Any]) -> HubFile | None:
    """The file an entry of the tree (or of paths-info) describes; None for a folder."""
    if info.get("type") != "file":
        return None
    lfs = info.get("lfs")
    return HubFile(info["path"], info["size"], info["oid"], lfs["oid"] if lfs else None)


class HubApi:
    """One repo's API on one endpoint, with one token (None or "": anonymous; the token
    cached in HF_HOME is never used), over ``transport``; ``what`` names the repo in errors."""

    def __init__(
        self,
        endpoint: str,
        repo_type: str,
        repo_id: str,
        token: str | None,
        version: str,
        transport: HttpTransport,
        what: str,
    ) -> None:
        self._base = f"{endpoint}/api/{repo_type}s/{repo_id}"
        self._headers = {
            **build_hf_headers(
                token=token or False, library_name="kf-initializers", library_version=version
            ),
            "Accept-Encoding": "gzip",  # a tree page of 1,000 files is ~5x smaller, as httpx asked
        }
        self._transport, self._what = transport, what

    def revision(self, revision: str) -> tuple[str, bool]:
        """The commit ``revision`` names, and whether the repo is gated; not its file list
        (the tree's pages give it as the fetch runs: a repo of 100,000 files would send
        megabytes of names before the first GET)."""
        query = urlencode({"expand": ["sha", "gated"]}, doseq=True)
        info, _ = self._call("GET", f"{self._base}/revision/{quote(revision, safe='')}?{query}")
        return info["sha"], bool(info.get("gated"))

    def tree_pages(self, commit: str, path: str) -> Iterator[tuple[list[HubFile], bool]]:
        """The recursive tree under ``path`` ("" for all of it), a page at a time with whether
        it was the last, following the ``Link: rel="next"`` the Hub sends."""
        url: str | None = f"{self._base}/tree/{quote(commit, safe='')}"
        if path:
            url += "/" + quote(path, safe="")
        url += "?" + urlencode({"recursive": "true", "expand": "false"})  # as httpx spells them
        while url is not None:
            page, headers = self._call("GET", url)
            url = httpx2.Response(200, headers=headers).links.get("next", {}).get("url")
            yield [file for file in map(hub_file, page) if file], url is None

    def path_info(self, commit: str, path: str) -> HubFile | bool:
        """What ``path`` is at ``commit``: the file, True for a folder, False for nothing."""
        form = urlencode({"paths": [path], "expand": "false"}, doseq=True).encode()
        found, _ = self._call(
            "POST",
            f"{self._base}/paths-info/{quote(commit, safe='')}",
            form,
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        if not found:
            return False
        return hub_file(found[0]) or True

    def _call(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> tuple[Any, Mapping[str, str]]:
        """The answer's JSON and headers; a status that is not 2xx raises what
        ``hf_raise_for_status`` makes of it, and a failed connection the transport's error."""
        headers = {**self._headers, **(extra or {})}
        status, answer_headers, content = self._transport.request(
            method, url, headers, self._what, body
        )
        if not 200 <= status < 300:
            request = httpx2.Request(method, url, headers=headers)
            hf_raise_for_status(
                httpx2.Response(status, headers=answer_headers, content=content, request=request)
            )
        return json.loads(content), answer_headers
