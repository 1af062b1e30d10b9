"""What an ``oci://`` URI names: a registry, a repository, a tag or digest, and a sub-path.

``oci://REGISTRY/REPOSITORY:TAG``, ``oci://REGISTRY/REPOSITORY@sha256:DIGEST``, either followed
by ``/sub/path`` (a folder inside the artifact, as ``hf://`` takes one). Without a tag or digest
the tag is ``latest``, as every container tool has it; the sub-path then cannot be told from the
repository, so it needs one. The registry is the first component, as Docker's rule has it: a
host with a dot or a port, or ``localhost``; ``docker.io`` is served by ``registry-1.docker.io``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from initializers.errors import UsageError
from initializers.fsutil import UnsafePathError, safe_relpath

# The distribution spec's grammar for repository names, tags and digests.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")
EXAMPLE = (
    "oci://registry.example.com/models/llama:v1 (or @sha256:<digest>, then an optional /sub/path)"
)


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port] as written (docker.io already mapped to its API host)
    repository: str
    reference: str  # a tag, or a digest "sha256:<hex>"
    subpath: str = ""  # a folder inside the artifact, "" for all of it

    @property
    def pinned(self) -> bool:
        """Named by digest: what it names can never change."""
        return self.reference.startswith("sha256:")

    def __str__(self) -> str:
        separator = "@" if self.pinned else ":"
        shown = f"oci://{self.registry}/{self.repository}{separator}{self.reference}"
        return f"{shown}/{self.subpath}" if self.subpath else shown

    @classmethod
    def parse(cls, location: str) -> Reference:
        registry, slash, rest = location.partition("/")
        if not slash or not rest or not _HOST.match(registry) or not _looks_like_host(registry):
            raise UsageError(
                f"oci://{location} does not start with a registry host; e.g. {EXAMPLE}"
            )
        if registry == "docker.io":
            registry = "registry-1.docker.io"
        repository, reference, subpath = _split_reference(rest, location)
        if registry == "registry-1.docker.io" and "/" not in repository:
            repository = f"library/{repository}"  # Docker Hub's official images
        try:
            subpath = safe_relpath(subpath) if subpath.strip("/") else ""
        except UnsafePathError as exc:
            raise UsageError(f"oci://{location}: the sub-path {exc}") from None
        return cls(registry, repository, reference, subpath)


def _looks_like_host(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost"


def _split_reference(rest: str, location: str) -> tuple[str, str, str]:
    """``repo@sha256:…[/sub]``, ``repo:tag[/sub]`` or ``repo`` → (repository, reference, sub)."""
    if "@" in rest:
        repository, _, pinned = rest.partition("@")
        digest, _, subpath = pinned.partition("/")
        if not _DIGEST.match(digest):
            raise UsageError(
                f"oci://{location}: {digest!r} is not a sha256 digest (sha256:<64 hex digits>)"
            )
        return _checked_repository(repository, location), digest, subpath
    repository, colon, after = rest.partition(":")  # a repository never holds a colon
    if colon:
        tag, _, subpath = after.partition("/")
        if not _TAG.match(tag):
            raise UsageError(f"oci://{location}: {tag!r} is not a valid tag")
        return _checked_repository(repository, location), tag, subpath
    return _checked_repository(rest, location), "latest", ""


def _checked_repository(repository: str, location: str) -> str:
    if not _REPOSITORY.match(repository):
        raise UsageError(
            f"oci://{location}: {repository!r} is not a valid repository name (lowercase "
            f"letters, digits and . _ - separators, / between components); e.g. {EXAMPLE}"
        )
    return repository
