"""A local stand-in for the Hugging Face Hub HTTP API, for tests, the demo and benchmarks.

Two listeners on 127.0.0.1 (or ``host``) speak what ``huggingface_hub`` 2.x expects from
huggingface.co:

* the **Hub** (``endpoint``): ``/api/{models,datasets}/{repo}[/revision/{rev}]`` (repo info),
  ``/api/.../tree/{rev}[/{path}]`` (paginated with ``Link: <...>; rel="next"``),
  ``POST /api/.../paths-info/{rev}``, and ``HEAD``/``GET``
  ``[/datasets]/{repo}/resolve/{rev}/{path}`` with ``X-Repo-Commit``, ``ETag``,
  ``X-Linked-Etag``/``X-Linked-Size`` and ``Range`` support;
* a **CDN** (``cdn_endpoint``, another port, so another origin): LFS files are answered by the Hub
  with ``302 Location: <signed, expiring CDN URL>``, exactly like the real Hub, so a client must
  drop ``Authorization`` on the redirect. Any ``Authorization`` the CDN sees lands in
  ``leaked_auth``.

Auth mirrors the Hub: an unknown token is refused everywhere (401 "Invalid credentials in
Authorization header", even on public repos); a private repo is hidden (401 ``RepoNotFound``
without a token, 404 with a valid token that has no access); a gated repo shows its metadata and
tree to anyone but answers ``resolve`` with ``GatedRepo`` (401 anonymous, 403 not accepted).

Repos keep every commit: ``add_repo`` creates ``main`` (and any other named revisions),
``commit`` pushes a new commit on a branch, ``tag`` names an existing one. Files are ``bytes`` or
paths on disk; disk files are hashed once (cached by inode/size/mtime) and sent with
``socket.sendfile``, never read whole. A file is LFS when its name matches ``lfs_patterns`` or it
is at least ``lfs_threshold`` bytes (the Hub's 10 MiB rule); an LFS file's tree ``oid`` is the git
blob id of its pointer file and its ETag is its sha256, as on the Hub.

Fault injection: set ``hub.fault`` to a callable taking the ``RequestRecord`` of each incoming
request (Hub and CDN alike) and returning a ``Fault`` (``Fault.error(503)``, ``Fault.drop()``,
``Fault.truncate(after_bytes)``, ``Fault.delay(seconds)``) or ``None``;
``fail_times(n, fault, ...)`` builds one that hits the first ``n`` matching requests. Every
request is logged (secrets redacted) in ``hub.requests``; handler crashes land in ``hub.errors``;
nothing goes to stderr.

    with HubServer() as hub:
        hub.tokens = {"hf_good"}
        hub.add_repo("org/model", {"config.json": b"{}", "model.safetensors": Path("w.bin")})
        api = HfApi(endpoint=hub.endpoint, token="hf_good")
        assert api.repo_info("org/model").sha == hub.sha("org/model")
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fnmatch
import gzip
import hashlib
import hmac
import itertools
import json
import os
import secrets
import socket
import socketserver
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

MiB = 1024 * 1024
_CHUNK = MiB
_URL_PREFIX = {"model": "", "dataset": "datasets/"}
_API_PLURAL = {"model": "models", "dataset": "datasets"}
_TYPE_OF_PLURAL = {plural: kind for kind, plural in _API_PLURAL.items()}
# What the Hub's default .gitattributes stores in LFS (plus the usual weight formats).
DEFAULT_LFS_PATTERNS: tuple[str, ...] = (
    "*.safetensors", "*.bin", "*.gguf", "*.parquet", "*.arrow", "*.pt", "*.pth", "*.ckpt",
    "*.h5", "*.msgpack", "*.onnx", "*.model", "*.npy", "*.npz", "*.pkl", "*.pickle", "*.joblib",
    "*.tflite", "*.ot", "*.zip", "*.gz", "*.tgz", "*.tar", "*.xz", "*.zst", "*.7z", "*tfevents*",
)  # fmt: skip

FileSource = bytes | os.PathLike
FaultHook = Callable[["RequestRecord"], "Fault | None"]


# ----------------------------------------------------------------------------------------------
# Content model: blobs, commits, repos


@dataclass(frozen=True)
class Blob:
    """One file's bytes (in memory or on disk) and the ids the Hub reports for it."""

    size: int
    git_oid: str  # the tree's "oid": git blob id of the content, or of the LFS pointer file
    sha256: str | None  # set for LFS files only
    data: bytes | None = None
    path: Path | None = None

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def etag(self) -> str:
        """What the Hub sends as ETag: sha256 for LFS files, git blob id otherwise."""
        return self.sha256 or self.git_oid


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git stores in place of an LFS file."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def git_blob_oid(data: bytes) -> str:
    """Git's blob id: sha1 over ``blob <size>\\0`` followed by the content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_hash_cache: dict[tuple[str, int, int, int, str], str] = {}
_hash_cache_lock = threading.Lock()


def _hash_file(path: Path, size: int, algo: Literal["git", "sha256"]) -> str:
    """Stream-hash a file on disk once; later calls for the unchanged file hit a cache."""
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, algo)
    with _hash_cache_lock:
        if key in _hash_cache:
            return _hash_cache[key]
    digest = hashlib.sha1(b"blob %d\0" % size) if algo == "git" else hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    with _hash_cache_lock:
        _hash_cache[key] = digest.hexdigest()
    return _hash_cache[key]


@dataclass(frozen=True)
class Commit:
    """An immutable snapshot: file path -> blob, plus the directory listing derived from it."""

    sha: str
    files: Mapping[str, Blob]
    date: dt.datetime
    dirs: Mapping[str, str] = field(default_factory=dict)  # directory path -> tree oid
    # Each (prefix, recursive) listing, made once: a commit never changes, and a paginated tree
    # of 100,000 files is asked for a page at a time.
    _listings: dict[tuple[str, bool], list[dict[str, Any]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def build(cls, sha: str, files: Mapping[str, Blob]) -> Commit:
        members: dict[str, list[str]] = {}
        for path, blob in sorted(files.items()):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                members.setdefault("/".join(parts[:depth]), []).append(f"{path} {blob.git_oid}")
        dirs = {d: hashlib.sha1("\n".join(m).encode()).hexdigest() for d, m in members.items()}
        return cls(sha, dict(files), dt.datetime.now(dt.UTC), dirs)

    def entries(self, prefix: str, recursive: bool) -> list[dict[str, Any]]:
        """Tree entries under ``prefix`` (all depths, or direct children), sorted by path."""
        made = self._listings.get((prefix, recursive))
        if made is None:
            made = self._listings[(prefix, recursive)] = self._entries(prefix, recursive)
        return made

    def _entries(self, prefix: str, recursive: bool) -> list[dict[str, Any]]:
        base = f"{prefix}/" if prefix else ""
        out = []
        for kind, table in (("directory", self.dirs), ("file", self.files)):
            for path in table:
                rest = path[len(base) :]
                if path.startswith(base) and rest and (recursive or "/" not in rest):
                    out.append(self.entry(path) if kind == "file" else self.dir_entry(path))
        return sorted(out, key=lambda e: e["path"])

    def entry(self, path: str) -> dict[str, Any]:
        blob = self.files[path]
        info: dict[str, Any] = {
            "type": "file",
            "oid": blob.git_oid,
            "size": blob.size,
            "path": path,
        }
        if blob.sha256 is not None:
            pointer_size = len(lfs_pointer(blob.sha256, blob.size))
            info["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": pointer_size}
        return info

    def dir_entry(self, path: str) -> dict[str, Any]:
        return {"type": "directory", "oid": self.dirs[path], "size": 0, "path": path}


@dataclass
class Repo:
    """A repo: its commits, its refs (branches and tags alike) and who may read it."""

    repo_id: str
    repo_type: str
    private: bool = False
    gated: Literal[False, "auto", "manual"] = False
    access: frozenset[str] | None = None  # tokens allowed (private) / that accepted (gated)
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)

    def allows(self, token: str | None) -> bool:
        return token is not None and (self.access is None or token in self.access)

    def lookup(self, revision: str) -> Commit | None:
        sha = self.refs.get(revision, revision)
        return self.commits.get(sha)


# ----------------------------------------------------------------------------------------------
# Request log and fault injection


@dataclass
class RequestRecord:
    """One request as a listener received it; ``authorization`` is redacted to ``Bearer ***``."""

    server: Literal["hub", "cdn"]
    method: str
    path: str
    headers: dict[str, str]
    status: int | None = None  # None until answered; 0 when the connection was dropped
    connection: int = 0  # serial number of the TCP connection (per listener): shows keep-alive
    arrived: float = field(default_factory=time.time)  # epoch seconds

    @property
    def range(self) -> str | None:
        return self.headers.get("range")


@dataclass(frozen=True)
class Fault:
    """What to do to one request instead of (or before) answering it normally."""

    kind: Literal["error", "drop", "truncate", "delay"]
    status: int = 503
    retry_after: int | None = None
    after_bytes: int = 0
    seconds: float = 0.0

    @classmethod
    def error(cls, status: int = 503, retry_after: int | None = None) -> Fault:
        """Answer with this status (and ``Retry-After``) instead of the real response."""
        return cls("error", status=status, retry_after=retry_after)

    @classmethod
    def drop(cls) -> Fault:
        """Close the connection without sending any response."""
        return cls("drop")

    @classmethod
    def truncate(cls, after_bytes: int, stall: float = 0.0) -> Fault:
        """Send real headers but only ``after_bytes`` of the body, wait ``stall`` s, then close."""
        return cls("truncate", after_bytes=after_bytes, seconds=stall)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Wait before answering normally (for timeout tests)."""
        return cls("delay", seconds=seconds)


def fail_times(
    n: int,
    fault: Fault,
    *,
    server: str | None = None,
    method: str | None = None,
    path_contains: str | None = None,
) -> FaultHook:
    """A fault hook that applies ``fault`` to the first ``n`` matching requests, then none."""
    remaining = itertools.count(n, -1)
    lock = threading.Lock()

    def hook(request: RequestRecord) -> Fault | None:
        if server is not None and request.server != server:
            return None
        if method is not None and request.method != method:
            return None
        if path_contains is not None and path_contains not in request.path:
            return None
        with lock:
            return fault if next(remaining) > 0 else None

    return hook


# ----------------------------------------------------------------------------------------------
# The server facade


class HubServer:
    """Hub + CDN listeners on 127.0.0.1 serving in-memory repos; see the module docstring.

    ``host`` binds both listeners (and the URLs they hand out) to another local address, e.g. a
    container bridge's gateway, so that containers on that network can reach them."""

    def __init__(
        self,
        *,
        lfs_threshold: int = 10 * MiB,
        lfs_patterns: Iterable[str] = DEFAULT_LFS_PATTERNS,
        tree_page_size: int = 1000,
        tree_page_size_expand: int = 50,
        reject_invalid_tokens: bool = True,
        cdn_url_ttl: float = 3600.0,
        cdn_origin: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.lfs_threshold = lfs_threshold
        self.lfs_patterns = tuple(lfs_patterns)
        self.tree_page_size = tree_page_size
        self.tree_page_size_expand = tree_page_size_expand
        self.reject_invalid_tokens = reject_invalid_tokens
        self.cdn_url_ttl = cdn_url_ttl
        # Where LFS redirects point: the CDN listener, or a faster server in front of
        # lfs_files() (the benchmark's nginx).
        self.cdn_origin = cdn_origin
        self.tokens: set[str] = set()
        self.fault: FaultHook | None = None
        self.requests: list[RequestRecord] = []
        self.leaked_auth: list[RequestRecord] = []
        self.errors: list[str] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._cdn_blobs: dict[str, Blob] = {}
        self._cdn_key = secrets.token_bytes(32)
        self._lock = threading.RLock()
        self._counter = itertools.count(1)
        self._listeners: list[_Listener] = []

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> HubServer:
        if not self._listeners:
            self._listeners = [
                _Listener(self, "hub", _HubHandler),
                _Listener(self, "cdn", _CdnHandler),
            ]
            for listener in self._listeners:
                name = f"hub-server-{listener.name}"
                threading.Thread(target=listener.serve, name=name, daemon=True).start()
        return self

    def stop(self) -> None:
        listeners, self._listeners = self._listeners, []
        closers = [threading.Thread(target=listener.close) for listener in listeners]
        for closer in closers:  # in parallel: each waits out one poll interval
            closer.start()
        for closer in closers:
            closer.join()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return self._listener("hub").url

    @property
    def cdn_endpoint(self) -> str:
        return self._listener("cdn").url

    def _listener(self, name: str) -> _Listener:
        for listener in self._listeners:
            if listener.name == name:
                return listener
        raise RuntimeError("HubServer is not started: call start() or use it as a context manager")

    # -- content -------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, FileSource] | None = None,
        *,
        repo_type: Literal["model", "dataset"] = "model",
        revisions: Mapping[str, Mapping[str, FileSource]] | None = None,
        private: bool = False,
        gated: Literal[False, "auto", "manual"] | bool = False,
        access: Iterable[str] | None = None,
    ) -> str:
        """Create a repo whose ``main`` holds ``files`` and each other revision its own file set.

        ``access`` lists the tokens that may read a private repo / accepted a gated repo's
        conditions; ``None`` means every token in ``tokens``. Returns the sha of ``main``.
        """
        if repo_type not in _URL_PREFIX:
            raise ValueError(f"repo_type must be one of {sorted(_URL_PREFIX)}, not {repo_type!r}")
        branches = dict(revisions or {})
        if files is not None or "main" not in branches:
            if "main" in branches:
                raise ValueError("give main's files either as files= or as revisions['main']")
            branches = {"main": files or {}, **branches}
        repo = Repo(
            repo_id=repo_id,
            repo_type=repo_type,
            private=private,
            gated="auto" if gated is True else gated,
            access=None if access is None else frozenset(access),
        )
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                raise ValueError(f"{repo_type} repo {repo_id!r} already exists")
            self._repos[(repo_type, repo_id)] = repo
        for name, branch_files in branches.items():
            self.commit(repo_id, branch_files, revision=name, repo_type=repo_type, replace=True)
        return repo.refs["main"]

    def commit(
        self,
        repo_id: str,
        files: Mapping[str, FileSource] | None = None,
        *,
        delete: Iterable[str] = (),
        revision: str = "main",
        repo_type: str = "model",
        replace: bool = False,
    ) -> str:
        """Push a commit on branch ``revision``: its current files, updated by ``files`` and minus
        ``delete`` (or exactly ``files`` when ``replace``). Moves the branch; returns the new sha.
        """
        new = {_check_path(p): self._blob(p, src) for p, src in (files or {}).items()}
        with self._lock:
            repo = self._repo_or_raise(repo_type, repo_id)
            parent = repo.lookup(revision) if revision in repo.refs else None
            tree = {} if replace or parent is None else dict(parent.files)
            for path in delete:
                if tree.pop(path, None) is None:
                    raise KeyError(f"{path!r} is not in {repo_id}@{revision}")
            tree.update(new)
            seed = f"{repo_type}/{repo_id}\n{parent.sha if parent else ''}\n{next(self._counter)}\n"
            listing = "".join(f"{p} {b.git_oid}\n" for p, b in sorted(tree.items()))
            sha = hashlib.sha1((seed + listing).encode()).hexdigest()
            repo.commits[sha] = Commit.build(sha, tree)
            repo.refs[revision] = sha
            for blob in tree.values():
                if blob.sha256 is not None:
                    self._cdn_blobs[blob.sha256] = blob
        return sha

    def tag(self, repo_id: str, tag: str, revision: str = "main", repo_type: str = "model") -> str:
        """Point ref ``tag`` at the commit ``revision`` names; returns that commit's sha."""
        with self._lock:
            repo = self._repo_or_raise(repo_type, repo_id)
            commit = repo.lookup(revision)
            if commit is None:
                raise KeyError(f"no revision {revision!r} in {repo_id}")
            repo.refs[tag] = commit.sha
        return commit.sha

    def sha(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str:
        """The commit sha a branch, tag or sha currently names."""
        with self._lock:
            commit = self._repo_or_raise(repo_type, repo_id).lookup(revision)
        if commit is None:
            raise KeyError(f"no revision {revision!r} in {repo_id}")
        return commit.sha

    def url(self, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> str:
        """The ``resolve`` URL of a file, as ``hf_hub_url`` builds it."""
        rev = quote(revision, safe="")
        return f"{self.endpoint}/{_URL_PREFIX[repo_type]}{repo_id}/resolve/{rev}/{quote(path)}"

    def find_requests(
        self, *, server: str | None = None, method: str | None = None, path_contains: str = ""
    ) -> list[RequestRecord]:
        """Logged requests matching all the given filters."""
        return [
            r
            for r in list(self.requests)
            if (server is None or r.server == server)
            and (method is None or r.method == method)
            and path_contains in r.path
        ]

    def _repo(self, repo_type: str, repo_id: str) -> Repo | None:
        with self._lock:
            return self._repos.get((repo_type, repo_id))

    def _repo_or_raise(self, repo_type: str, repo_id: str) -> Repo:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise KeyError(f"no {repo_type} repo {repo_id!r}; call add_repo first")
        return repo

    def _blob(self, path: str, source: FileSource) -> Blob:
        if isinstance(source, bytes | bytearray | memoryview):
            data = bytes(source)
            if not self._is_lfs(path, len(data)):
                return Blob(len(data), git_blob_oid(data), None, data=data)
            sha256 = hashlib.sha256(data).hexdigest()
            return Blob(len(data), git_blob_oid(lfs_pointer(sha256, len(data))), sha256, data=data)
        if isinstance(source, os.PathLike):
            file = Path(source)
            size = file.stat().st_size
            if not self._is_lfs(path, size):
                return Blob(size, _hash_file(file, size, "git"), None, path=file)
            sha256 = _hash_file(file, size, "sha256")
            return Blob(size, git_blob_oid(lfs_pointer(sha256, size)), sha256, path=file)
        raise TypeError(f"file {path!r}: give bytes or a path, not {type(source).__name__}")

    def _is_lfs(self, path: str, size: int) -> bool:
        name = path.rsplit("/", 1)[-1]
        return size >= self.lfs_threshold or any(
            fnmatch.fnmatch(name, p) for p in self.lfs_patterns
        )

    # -- CDN URLs ------------------------------------------------------------------------------

    def _cdn_url(self, blob: Blob, filename: str) -> str:
        expires = str(int(time.time() + self.cdn_url_ttl))
        query = {"expires": expires, "signature": self._sign(blob.etag, expires), "name": filename}
        return f"{self.cdn_origin or self.cdn_endpoint}/lfs/{blob.etag}?{urlencode(query)}"

    def lfs_files(self) -> dict[str, Path]:
        """The on-disk file of every LFS blob, by sha256 — what a server standing in for the
        CDN serves at ``/lfs/<sha256>``."""
        with self._lock:
            return {sha: blob.path for sha, blob in self._cdn_blobs.items() if blob.path}

    def _sign(self, sha256: str, expires: str) -> str:
        return hmac.new(self._cdn_key, f"{sha256}:{expires}".encode(), "sha256").hexdigest()


def _check_path(path: str) -> str:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"repo file paths are relative POSIX paths, got {path!r}")
    return path


# ----------------------------------------------------------------------------------------------
# HTTP plumbing


class _Listener(ThreadingHTTPServer):
    """A quiet threaded HTTP/1.1 listener that can also drop its open keep-alive connections."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, hub: HubServer, name: str, handler: type[BaseHTTPRequestHandler]) -> None:
        self.hub = hub
        super().__init__((hub.host, 0), handler)
        self.name = name
        self.url = f"http://{hub.host}:{self.server_address[1]}"
        self.open_connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        self.connection_serial = itertools.count(1)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # skips HTTPServer's reverse-DNS lookup
        self.server_name, self.server_port = self.hub.host, self.server_address[1]

    def serve(self) -> None:
        self.serve_forever(poll_interval=0.02)

    def close(self) -> None:
        self.shutdown()
        with self.connections_lock:
            for conn in self.open_connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self.server_close()

    def handle_error(self, request: object, client_address: object) -> None:
        """Record server bugs for tests to assert on; a client hanging up is not one."""
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            self.hub.errors.append(traceback.format_exc())


class _HttpError(Exception):
    """An error answer: status, Hub ``X-Error-Code`` (if any), message, extra headers."""

    def __init__(self, status: int, code: str | None, message: str, **headers: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


class _Handler(BaseHTTPRequestHandler):
    """Shared request plumbing: logging, faults, error answers, ranged bodies."""

    server: _Listener
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 120
    server_version = "local-hub"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.open_connections.add(self.connection)
            self.serial = next(self.server.connection_serial)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.open_connections.discard(self.connection)
        super().finish()

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``hub.requests`` instead of stderr."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def route(self, path: list[str], query: dict[str, list[str]], body: bytes) -> None:
        raise NotImplementedError

    def _dispatch(self) -> None:
        hub = self.server.hub
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        if "authorization" in headers:
            headers["authorization"] = headers["authorization"].split(" ", 1)[0] + " ***"
        self.record = RequestRecord(
            self.server.name,  # type: ignore[arg-type]
            self.command,
            self.path,
            headers,
            connection=self.serial,
        )
        hub.requests.append(self.record)
        self.truncate: Fault | None = None
        fault = hub.fault(self.record) if hub.fault is not None else None
        if fault is not None:
            if fault.kind == "delay":
                time.sleep(fault.seconds)
            elif fault.kind == "drop":
                self.record.status, self.close_connection = 0, True
                return
            elif fault.kind == "truncate":
                self.truncate = fault
            else:
                retry = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
                self._send_error(_HttpError(fault.status, None, "Injected fault", **retry))
                return
        url = urlsplit(self.path)
        segments = [unquote(s) for s in url.path.split("/")[1:]]
        while segments and not segments[-1]:
            segments.pop()
        try:
            self.route(segments, parse_qs(url.query), body)
        except _HttpError as error:
            self._send_error(error)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception:
            hub.errors.append(traceback.format_exc())
            if self.record.status is None:
                self._send_error(_HttpError(500, None, "Internal error in the test Hub"))
            self.close_connection = True

    # -- answers -------------------------------------------------------------------------------

    def _start(self, status: int, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.record.status = status

    def _send_bytes(self, status: int, headers: Mapping[str, str], payload: bytes) -> None:
        self._start(status, {**headers, "Content-Length": str(len(payload))})
        if self.command != "HEAD":
            self._write(payload, 0, len(payload))

    def _send_json(self, payload: object, **headers: str) -> None:
        body = json.dumps(payload).encode()
        if "gzip" in self.headers.get("Accept-Encoding", ""):  # as the Hub's API answers
            body, headers = gzip.compress(body, 1), {**headers, "Content-Encoding": "gzip"}
        self._send_bytes(200, {"Content-Type": "application/json; charset=utf-8", **headers}, body)

    def _send_error(self, error: _HttpError) -> None:
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "X-Error-Message": error.message,
        }
        if error.code:
            headers["X-Error-Code"] = error.code
        body = json.dumps({"error": error.message}).encode()
        self._send_bytes(error.status, {**headers, **error.headers}, body)

    def _send_blob(self, blob: Blob, headers: dict[str, str]) -> None:
        """Answer 200 with the whole blob, or 206 for one satisfiable ``Range`` (416 otherwise)."""
        span = _parse_range(self.headers.get("Range"), blob.size)
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
        if span is None:
            start, length, status = 0, blob.size, 200
        else:
            start, length, status = span[0], span[1] - span[0] + 1, 206
            headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{blob.size}"
        self._start(status, {**headers, "Content-Length": str(length)})
        if self.command != "HEAD":
            self._write(blob.path if blob.data is None else blob.data, start, length)  # type: ignore[arg-type]

    def _write(self, source: bytes | Path, start: int, length: int) -> None:
        """Send ``length`` bytes of ``source`` from ``start`` (files via zero-copy ``sendfile``),
        cut short by a truncate fault."""
        cut = self.truncate is not None and self.truncate.after_bytes < length
        if cut:
            length = self.truncate.after_bytes  # type: ignore[union-attr]
        if isinstance(source, bytes):
            self.wfile.write(memoryview(source)[start : start + length])
        elif length:
            with source.open("rb") as f:
                self.connection.sendfile(f, start, length)
        if cut:
            time.sleep(self.truncate.seconds)  # type: ignore[union-attr]
            self.close_connection = True

    def _bearer_token(self) -> str | None:
        header = self.headers.get("Authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else header


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive (first, last) byte of one ``bytes=`` range; None means "send it all".

    Raises 416 when the range cannot be satisfied. Malformed or multi-part ranges are ignored,
    as RFC 9110 allows.
    """
    if not header:
        return None
    unit, _, spec = header.partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip().lower() != "bytes" or "," in spec or not dash:
        return None
    try:
        if not first:
            start, end = size - int(last), size - 1
            if int(last) <= 0 or size == 0:
                raise _unsatisfiable(size)
            return max(start, 0), end
        start, end = int(first), int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    if end < start:
        return None
    return start, min(end, size - 1)


def _unsatisfiable(size: int) -> _HttpError:
    return _HttpError(
        416, None, "Requested Range Not Satisfiable", **{"Content-Range": f"bytes */{size}"}
    )


def _split_repo(
    hub: HubServer, repo_type: str, segments: list[str], markers: set[str]
) -> tuple[str, list[str]] | None:
    """Split ``org/name/<marker>/...`` or legacy ``name/<marker>/...`` into (repo_id, rest)."""
    two = len(segments) >= 2 and (len(segments) == 2 or segments[2] in markers)
    one = len(segments) >= 1 and (len(segments) == 1 or segments[1] in markers)
    if two and one and hub._repo(repo_type, "/".join(segments[:2])) is None:
        two = hub._repo(repo_type, segments[0]) is None
    if two:
        return "/".join(segments[:2]), segments[2:]
    if one:
        return segments[0], segments[1:]
    return None


class _HubHandler(_Handler):
    """The Hub: repo info, tree listings, paths-info and ``resolve``."""

    def route(self, path: list[str], query: dict[str, list[str]], body: bytes) -> None:
        if len(path) >= 3 and path[0] == "api" and path[1] in _TYPE_OF_PLURAL:
            repo_type = _TYPE_OF_PLURAL[path[1]]
            split = _split_repo(
                self.server.hub, repo_type, path[2:], {"revision", "tree", "paths-info"}
            )
            if split is not None:
                self._api(repo_type, *split, query, body)
                return
        elif path[:1] == ["datasets"]:
            split = _split_repo(self.server.hub, "dataset", path[1:], {"resolve"})
            if split is not None and len(split[1]) >= 2 and self.command in ("GET", "HEAD"):
                self._resolve("dataset", split[0], split[1][1], "/".join(split[1][2:]))
                return
        else:
            split = _split_repo(self.server.hub, "model", path, {"resolve"})
            if split is not None and len(split[1]) >= 2 and self.command in ("GET", "HEAD"):
                self._resolve("model", split[0], split[1][1], "/".join(split[1][2:]))
                return
        raise _HttpError(404, None, "Not Found")

    def _api(
        self,
        repo_type: str,
        repo_id: str,
        rest: list[str],
        query: dict[str, list[str]],
        body: bytes,
    ) -> None:
        post = self.command == "POST"
        if not rest and not post:
            self._info(self._authorize(repo_type, repo_id, content=False), "main", query)
        elif len(rest) == 2 and rest[0] == "revision" and not post:
            self._info(self._authorize(repo_type, repo_id, content=False), rest[1], query)
        elif len(rest) >= 2 and rest[0] == "tree" and not post:
            repo = self._authorize(repo_type, repo_id, content=False)
            self._tree(repo, rest[1], "/".join(rest[2:]), query)
        elif len(rest) == 2 and rest[0] == "paths-info" and post:
            repo = self._authorize(repo_type, repo_id, content=False)
            self._paths_info(repo, rest[1], parse_qs(body.decode()))
        else:
            raise _HttpError(404, None, "Not Found")

    def _authorize(self, repo_type: str, repo_id: str, *, content: bool) -> Repo:
        """The repo, if this request may see it (and, when ``content``, download from it)."""
        hub = self.server.hub
        token = self._bearer_token()
        if token is not None and token not in hub.tokens and hub.reject_invalid_tokens:
            raise _HttpError(401, None, "Invalid credentials in Authorization header")
        valid = token if token in hub.tokens else None
        repo = hub._repo(repo_type, repo_id)
        if repo is None or (repo.private and not repo.allows(valid)):
            raise _HttpError(401 if valid is None else 404, "RepoNotFound", "Repository not found")
        if content and repo.gated and not repo.allows(valid):
            what = f"{repo_type} {repo_id}"
            if valid is None:
                message = (
                    f"Access to {what} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."
                )
                raise _HttpError(401, "GatedRepo", message)
            page = f"{hub.endpoint}/{_URL_PREFIX[repo_type]}{repo_id}"
            message = (
                f"Access to {what} is restricted and you are not in the authorized list. "
                f"Visit {page} to accept the conditions and ask for access."
            )
            raise _HttpError(403, "GatedRepo", message)
        return repo

    def _commit(self, repo: Repo, revision: str) -> Commit:
        with self.server.hub._lock:
            commit = repo.lookup(revision)
        if commit is None:
            raise _HttpError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _info(self, repo: Repo, revision: str, query: dict[str, list[str]]) -> None:
        commit = self._commit(repo, revision)
        with self.server.hub._lock:
            created = min(c.date for c in repo.commits.values())
        blobs = _truthy(query.get("blobs"))
        # As the Hub: with expand, only the properties asked for (and the ids) come back.
        wanted = query.get("expand") or query.get("expand[]")
        siblings = []
        for path in sorted(commit.files) if not wanted or "siblings" in wanted else ():
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                entry = commit.entry(path)
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if "lfs" in entry:
                    lfs = entry["lfs"]
                    sibling["lfs"] = {
                        "sha256": lfs["oid"],
                        "size": lfs["size"],
                        "pointerSize": lfs["pointerSize"],
                    }
            siblings.append(sibling)
        info: dict[str, Any] = {
            "_id": hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}".encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
            "sha": commit.sha,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(created),
            "private": repo.private,
            "gated": repo.gated,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(b.size for b in commit.files.values()),
        }
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        if wanted:
            info = {k: v for k, v in info.items() if k in {"_id", "id", *wanted}}
        self._send_json(info)

    def _tree(self, repo: Repo, revision: str, prefix: str, query: dict[str, list[str]]) -> None:
        commit = self._commit(repo, revision)
        if prefix and prefix not in commit.dirs:
            message = f"{prefix} does not exist on {revision!r} or is not a directory"
            raise _HttpError(404, "EntryNotFound", message, **{"X-Repo-Commit": commit.sha})
        recursive, expand = _truthy(query.get("recursive")), _truthy(query.get("expand"))
        entries = commit.entries(prefix, recursive)
        hub = self.server.hub
        size = hub.tree_page_size_expand if expand else hub.tree_page_size
        offset = _decode_cursor(query.get("cursor"))
        headers: dict[str, str] = {"X-Repo-Commit": commit.sha}
        if offset + size < len(entries):
            cursor = base64.urlsafe_b64encode(json.dumps({"offset": offset + size}).encode())
            flags = {"recursive": str(recursive).lower(), "expand": str(expand).lower()}
            params = urlencode({**flags, "cursor": cursor.decode()})
            next_url = f"{hub.endpoint}{urlsplit(self.path).path}?{params}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._send_json(entries[offset : offset + size], **headers)

    def _paths_info(self, repo: Repo, revision: str, form: dict[str, list[str]]) -> None:
        commit = self._commit(repo, revision)
        out = []
        for path in form.get("paths", []):
            if path in commit.files:
                out.append(commit.entry(path))
            elif path in commit.dirs:
                out.append(commit.dir_entry(path))
        self._send_json(out)

    def _resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        repo = self._authorize(repo_type, repo_id, content=True)
        commit = self._commit(repo, revision)
        blob = commit.files.get(path)
        if blob is None:
            message = f"{path} does not exist on {revision!r}"
            raise _HttpError(404, "EntryNotFound", message, **{"X-Repo-Commit": commit.sha})
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{blob.etag}"'}
        if not blob.lfs:
            self._send_blob(blob, headers)
            return
        headers["X-Linked-Etag"] = f'"{blob.etag}"'
        headers["X-Linked-Size"] = str(blob.size)
        headers["Location"] = self.server.hub._cdn_url(blob, path.rsplit("/", 1)[-1])
        self._send_bytes(302, headers, b"")


class _CdnHandler(_Handler):
    """The CDN: serves LFS blobs by sha256 behind signed, expiring URLs; records leaked auth."""

    def route(self, path: list[str], query: dict[str, list[str]], body: bytes) -> None:
        hub = self.server.hub
        if "authorization" in self.record.headers:
            hub.leaked_auth.append(self.record)
        if len(path) != 2 or path[0] != "lfs" or self.command not in ("GET", "HEAD"):
            raise _HttpError(404, None, "Not Found")
        sha256 = path[1]
        expires = (query.get("expires") or [""])[0]
        signature = (query.get("signature") or [""])[0]
        if not hmac.compare_digest(signature, hub._sign(sha256, expires)):
            raise _HttpError(403, None, "AccessDenied: bad signature")
        if int(expires) < time.time():
            raise _HttpError(403, None, "AccessDenied: Request has expired")
        blob = hub._cdn_blobs.get(sha256)
        if blob is None:
            raise _HttpError(404, None, "NoSuchKey")
        name = (query.get("name") or [sha256])[0]
        ascii_name = name.encode("ascii", "replace").decode().replace('"', "_")
        disposition = f"inline; filename*=UTF-8''{quote(name)}; filename=\"{ascii_name}\""
        headers = {"ETag": f'"{sha256}"', "Content-Disposition": disposition}
        self._send_blob(blob, headers)


def _truthy(values: list[str] | None) -> bool:
    # Exactly what huggingface_hub's httpx client sends for True: a client that spells it
    # "True" (Python's str) must not get a recursive tree here when the Hub may not give one.
    return bool(values) and values[0] in ("1", "true")  # type: ignore[index]


def _decode_cursor(values: list[str] | None) -> int:
    if not values:
        return 0
    try:
        return int(json.loads(base64.urlsafe_b64decode(values[0]))["offset"])
    except (ValueError, KeyError, TypeError) as exc:
        raise _HttpError(400, None, "Invalid cursor") from exc


def _iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
