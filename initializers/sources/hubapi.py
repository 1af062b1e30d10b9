"""The three Hub API calls a fetch makes, through huggingface_hub's session and error mapping.

Why not ``HfApi``: importing ``huggingface_hub.hf_api`` cost ~130 ms of every Hub run's start
(on top of this package's own imports), about 40% of its time to the first byte; the calls a
fetch needs are three GETs and a POST. They are made as ``HfApi`` makes them (``model_info`` /
``dataset_info`` with ``expand``, the tree a page at a time as ``_iter_repo_tree_pages`` does,
``get_paths_info``): the same URLs and parameters, the same headers (``build_hf_headers``), on
the same shared client (``get_session``), and every answer checked by ``hf_raise_for_status``,
so a missing repo, revision or path, a gated or disabled repo raise the errors ``HfApi`` raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from huggingface_hub import get_session
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status


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
    cached in HF_HOME is never used)."""

    def __init__(
        self, endpoint: str, repo_type: str, repo_id: str, token: str | None, version: str
    ) -> None:
        self._base = f"{endpoint}/api/{repo_type}s/{repo_id}"
        self._headers = build_hf_headers(
            token=token or False, library_name="kf-initializers", library_version=version
        )

    def revision(self, revision: str) -> tuple[str, bool]:
        """The commit ``revision`` names, and whether the repo is gated; not its file list
        (the tree's pages give it as the fetch runs: a repo of 100,000 files would send
        megabytes of names before the first GET)."""
        answer = get_session().get(
            f"{self._base}/revision/{quote(revision, safe='')}",
            headers=self._headers,
            params={"expand": ["sha", "gated"]},
        )
        hf_raise_for_status(answer)
        info = answer.json()
        return info["sha"], bool(info.get("gated"))

    def tree_pages(self, commit: str, path: str) -> Iterator[tuple[list[HubFile], bool]]:
        """The recursive tree under ``path`` ("" for all of it), a page at a time with whether
        it was the last, following the ``Link: rel="next"`` the Hub sends."""
        url: str | None = f"{self._base}/tree/{quote(commit, safe='')}"
        if path:
            url += "/" + quote(path, safe="")
        params: dict[str, Any] | None = {"recursive": True, "expand": False}
        while url is not None:
            answer = get_session().get(url, headers=self._headers, params=params)
            hf_raise_for_status(answer)
            url, params = answer.links.get("next", {}).get("url"), None  # it carries the query
            yield [file for file in map(hub_file, answer.json()) if file], url is None

    def path_info(self, commit: str, path: str) -> HubFile | bool:
        """What ``path`` is at ``commit``: the file, True for a folder, False for nothing."""
        answer = get_session().post(
            f"{self._base}/paths-info/{quote(commit, safe='')}",
            data={"paths": [path], "expand": False},
            headers=self._headers,
        )
        hf_raise_for_status(answer)
        found = answer.json()
        if not found:
            return False
        return hub_file(found[0]) or True
