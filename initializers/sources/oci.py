"""oci:// — models and datasets from an OCI registry (the distribution API), verified by digest.

A tag is resolved to a manifest digest once, at listing; every later request names blobs by
digest, so a tag pushed again mid-fetch cannot mix two versions, and the manifest records the
digest, so a rerun against an unchanged one does nothing. An image index gives the manifest of
``--platform`` (default linux/amd64). What the layers are (files, tars of files, an image's
layers) is :mod:`~initializers.sources.ocilayout`'s to say; a layout of plain files is fetched
as any source's files are (parallel ranges, resumable), a layout with tars is unpacked by the
engine's layered path (:mod:`initializers.unpack`). Every blob is verified against its
sha256 digest before anything takes its bytes.

Registries are spoken to over https (``--ca-bundle`` for a private CA); plain http only for a
registry named in ``OCI_INSECURE_REGISTRIES``. Blob redirects (to object storage) are followed
without the registry's Authorization header.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from initializers.errors import AuthError, IntegrityError, NotFoundError, TlsRefused, UsageError
from initializers.fsutil import UnsafePathError, safe_relpath
from initializers.httpstatus import is_transient, status_error, transient
from initializers.options import SourceSettings
from initializers.sources.base import (
    Checksum,
    Layer,
    Layered,
    Listing,
    RemoteFile,
    Skipped,
    Source,
)
from initializers.sources.ociauth import RegistryAuth, find_login
from initializers.sources.ocilayout import MODELCAR_ROOT, LayerPlan, classify
from initializers.sources.ociref import Reference
from initializers.streams import RangeReader
from initializers.transport import HttpTransport

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
MAX_MANIFEST = 4 << 20  # the distribution spec's limit registries enforce
AUTH_ATTEMPTS = 3  # anonymous, then challenged, then renewed once


class OciSource(Source):
    """The files of one artifact or image in a registry."""

    def __init__(self, ref: Reference, settings: SourceSettings) -> None:
        self.ref = ref
        self.retry = settings.retry
        plain = ref.registry.lower() in settings.oci_insecure_registries
        self._api = f"{'http' if plain else 'https'}://{ref.registry}/v2/{ref.repository}"
        self._transport = HttpTransport.for_settings(settings)
        login = find_login(ref.registry, settings)
        self._auth = RegistryAuth(self._transport, login, ref.repository, str(ref), plain)
        self._platform = settings.oci_platform
        self._layered: Layered | None = None

    @classmethod
    def from_settings(cls, location: str, settings: SourceSettings) -> Self:
        return cls(Reference.parse(location), settings)

    def describe(self) -> str:
        return str(self.ref)

    # -- listing --------------------------------------------------------------------------------

    def list(self) -> Listing:
        try:
            manifest, digest = self._platform_manifest()
        except TlsRefused:
            raise TlsRefused(
                f"{self.ref}: TLS verification failed; pass --ca-bundle with the registry's CA, "
                "or, for a registry serving plain http, name it in OCI_INSECURE_REGISTRIES"
            ) from None
        layout = classify(manifest, str(self.ref))
        log.info("%s is %s", self.ref, digest)
        if layout.files_only and not layout.image:
            files, skipped = self._named_files(layout.layers)
            return Listing(digest, files, skipped)
        root = self.ref.subpath or (MODELCAR_ROOT if layout.image else "")
        layers = tuple(Layer(_blob(plan), plan.name) for plan in layout.layers)
        self._layered = Layered(layers, digest, root, whiteouts=layout.image)
        return Listing(digest, self._layered.blobs)

    def layered(self, listing: Listing) -> Layered | None:
        return self._layered

    def _named_files(self, layers: Sequence[LayerPlan]) -> tuple[list[RemoteFile], list[Skipped]]:
        """The layers as files, those under the sub-path named relative to it."""
        files: dict[str, RemoteFile] = {}
        skipped: list[Skipped] = []
        prefix = f"{self.ref.subpath}/" if self.ref.subpath else ""
        for plan in layers:
            name = plan.name
            if prefix:
                if name == self.ref.subpath:
                    name = name.rsplit("/", 1)[-1]
                elif name.startswith(prefix):
                    name = name.removeprefix(prefix)
                else:
                    continue
            try:
                path = safe_relpath(name)
            except UnsafePathError as exc:
                skipped.append((plan.name, f"the name {exc}"))
                continue
            if path in files:
                skipped.append((plan.name, "a second layer of the same name"))
                continue
            files[path] = _blob(plan, path)
        if not files:
            raise NotFoundError(f"{self.ref}: no file of the artifact is under {prefix}")
        return list(files.values()), skipped

    def _platform_manifest(self) -> tuple[dict[str, Any], str]:
        """The image manifest the reference names, through an index for the platform."""
        manifest, digest = self._manifest(self.ref.reference)
        if "manifests" in manifest and "layers" not in manifest:
            chosen = _for_platform(manifest["manifests"], self._platform, str(self.ref))
            manifest, digest = self._manifest(chosen)
        return manifest, digest

    def _manifest(self, reference: str) -> tuple[dict[str, Any], str]:
        """A manifest (or index) by tag or digest, and its digest, checked against its bytes."""
        url = f"{self._api}/manifests/{reference}"
        status, headers, body = self._get(url, {"Accept": ACCEPT}, str(self.ref))
        if status == 404:
            raise NotFoundError(
                f"{self.ref}: {reference} is not in {self.ref.registry}/{self.ref.repository} "
                "(check the repository and the tag or digest)"
            )
        failure = status_error(status, str(self.ref), headers)
        if failure is not None:
            raise failure
        if len(body) > MAX_MANIFEST:
            raise IntegrityError(f"{self.ref}: the manifest is larger than 4 MiB")
        digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
        said = headers.get("Docker-Content-Digest", "")
        wanted = reference if reference.startswith("sha256:") else said
        if wanted.startswith("sha256:") and wanted != digest:
            raise IntegrityError(
                f"{self.ref}: the manifest's bytes are {digest}, not the {wanted} asked for"
            )
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise IntegrityError(f"{self.ref}: the registry's manifest is not a JSON object")
        return document, digest

    # -- requests -------------------------------------------------------------------------------

    def _get(
        self, url: str, headers: Mapping[str, str], what: str
    ) -> tuple[int, Mapping[str, str], bytes]:
        """A small GET read whole, authorized as the registry asks, retried when transient."""

        def attempt() -> tuple[int, Mapping[str, str], bytes]:
            for _ in range(AUTH_ATTEMPTS):
                sent = {**headers, **self._auth.headers()}
                status, answer, body = self._transport.request("GET", url, sent, what)
                if is_transient(status):  # retried here, with the wait it asks for
                    raise transient(f"{what}: HTTP {status}", answer)
                if status != 401:
                    return status, answer, body
                self._auth.refused(sent, answer)
            raise self._auth.denied()

        return self.retry.call(attempt, what)

    def open_range(self, file: RemoteFile, start: int, end: int) -> RangeReader:
        url = f"{self._api}/blobs/{file.locator}"
        whole = start == 0 and end == file.size
        return self._authorized(
            lambda sent: self._transport.open_range(url, sent, start, end, file.path, whole=whole)
        )

    def _authorized(self, request: Callable[[dict[str, str]], RangeReader]) -> RangeReader:
        """``request`` with the current Authorization; a refusal renews it (a token expired)."""
        for attempt in range(AUTH_ATTEMPTS):
            sent = self._auth.headers()
            try:
                return request(sent)
            except AuthError:
                if attempt == AUTH_ATTEMPTS - 1:
                    raise
                self._auth.refused(sent, None)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._transport.close()


def _blob(plan: LayerPlan, path: str = "") -> RemoteFile:
    """A layer's blob as a file: under ``path``, or (to be unpacked) under its digest."""
    hex_digest = plan.digest.removeprefix("sha256:")
    return RemoteFile(
        path=path or f"sha256-{hex_digest}",
        size=plan.size,
        version=plan.digest,
        checksum=Checksum("sha256", hex_digest),
        locator=plan.digest,
    )


def _for_platform(entries: Any, wanted: str, shown: str) -> str:
    """The digest of the index entry for ``wanted`` (os/arch[/variant])."""
    if not isinstance(entries, list) or not entries:
        raise UsageError(f"{shown}: the image index lists no manifests")
    want = wanted.split("/")
    offered: list[str] = []
    for entry in entries:
        platform = entry.get("platform") if isinstance(entry, dict) else None
        if not isinstance(platform, dict):
            continue
        have = [platform.get("os", ""), platform.get("architecture", "")]
        if platform.get("variant"):
            have.append(platform["variant"])
        if "unknown" in have:  # a build's attestation, not a platform
            continue
        offered.append("/".join(have))
        if have[:2] == want[:2] and (len(want) == 2 or have[2:] == want[2:]):
            return str(entry["digest"])
    if not offered and len(entries) == 1 and isinstance(entries[0], dict):
        return str(entries[0].get("digest", ""))  # one manifest, for no platform in particular
    raise NotFoundError(
        f"{shown} has no manifest for {wanted} (it has {', '.join(offered) or 'none'}); "
        "choose one with --platform / OCI_PLATFORM"
    )
