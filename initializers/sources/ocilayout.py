"""What an OCI manifest's layers are, told from their media types and annotations.

Three layouts:

- **Files** (ORAS, CNCF ModelPack, KitOps ModelKit): each layer is one file, named by its
  ModelPack file-path or ``org.opencontainers.image.title`` annotation; or a tar of files
  (ModelPack and ModelKit ``.tar``/``.tar+gzip``/``.tar+zstd`` layers, an ORAS folder marked
  ``io.deis.oras.content.unpack`` or pushed as ``tar+gzip``), unpacked where the names inside
  it say.
- **An image** (a KServe modelcar): an image config and no named layer; the layers are applied
  in order, whiteouts honoured, and one folder is kept: ``models`` (KServe's), or the sub-path.
- Anything else is refused, naming the media types found.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from initializers.errors import UsageError

IMAGE_CONFIGS = frozenset(
    {"application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"}
)
TITLE = "org.opencontainers.image.title"
NAME_ANNOTATIONS = ("org.cncf.model.filepath", TITLE)  # ModelPack's path first
UNPACK = "io.deis.oras.content.unpack"  # ORAS: a folder, tarred
ORAS_FOLDER = "application/vnd.oci.image.layer.v1.tar+gzip"  # how oras-py pushes a folder
PACKAGED = ("application/vnd.cncf.model.", "application/vnd.kitops.")  # ModelPack, ModelKit
TAR_ENDINGS = (".tar", ".tar+gzip", ".tar+zstd", ".tar.gzip", ".tar.zstd", ".tar.gz")
MODELCAR_ROOT = "models"


@dataclass(frozen=True)
class LayerPlan:
    """One layer: its blob (digest and size) and, for a file placed as it is, its name."""

    digest: str
    size: int
    name: str = ""  # "": a tar, unpacked


@dataclass(frozen=True)
class Layout:
    layers: tuple[LayerPlan, ...]
    image: bool  # a container image: whiteouts, and a root folder kept

    @property
    def files_only(self) -> bool:
        return all(layer.name for layer in self.layers)


def classify(manifest: Mapping[str, Any], shown: str) -> Layout:
    """The layout of an image manifest; UsageError (exit 2) for one that is none of them."""
    config = (manifest.get("config") or {}).get("mediaType", "")
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise UsageError(f"{shown}: the manifest lists no layers")
    named = any(_name(layer) for layer in layers)
    if config in IMAGE_CONFIGS and not named:
        if not all(_is_tar(layer.get("mediaType", "")) for layer in layers):
            raise _unknown(shown, config, layers)
        return Layout(tuple(_plan(layer, "") for layer in layers), image=True)
    planned = []
    for layer in layers:
        media_type, name = layer.get("mediaType", ""), _name(layer)
        if _is_tar(media_type) and (_unpacks(layer) or media_type.startswith(PACKAGED)):
            planned.append(_plan(layer, ""))
        elif name and (media_type.endswith(".raw") or not media_type.startswith(PACKAGED)):
            planned.append(_plan(layer, name))
        else:
            raise _unknown(shown, config, layers)
    if not planned:
        raise UsageError(f"{shown}: the artifact has no layers, so nothing to fetch")
    return Layout(tuple(planned), image=False)


def _name(layer: Mapping[str, Any]) -> str:
    annotations = layer.get("annotations") or {}
    return next((annotations[key] for key in NAME_ANNOTATIONS if annotations.get(key)), "")


def _unpacks(layer: Mapping[str, Any]) -> bool:
    annotations = layer.get("annotations") or {}
    marked = str(annotations.get(UNPACK, "")).lower() == "true"
    return marked or layer.get("mediaType") == ORAS_FOLDER


def _is_tar(media_type: str) -> bool:
    return media_type.endswith(TAR_ENDINGS)


def _plan(layer: Mapping[str, Any], name: str) -> LayerPlan:
    digest, size = layer.get("digest", ""), layer.get("size")
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise UsageError(f"a layer's digest {digest!r} is not sha256 (the only one supported)")
    if not isinstance(size, int) or size < 0:
        raise UsageError(f"layer {digest} has no valid size")
    return LayerPlan(digest, size, name)


def _unknown(shown: str, config: str, layers: Sequence[Mapping[str, Any]]) -> UsageError:
    types = sorted({str(layer.get("mediaType", "?")) for layer in layers})
    return UsageError(
        f"{shown}: not a layout this initializer knows (config {config or 'none'}; layers "
        f"{', '.join(types)}); push files with ORAS or a ModelPack/ModelKit tool, or an image "
        f"with the model under /{MODELCAR_ROOT} (a modelcar)"
    )
