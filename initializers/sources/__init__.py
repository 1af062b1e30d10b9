"""Sources, registered by URI scheme and imported on first use.

Adding a scheme is one row here plus one module implementing :class:`~.base.Source`; the engine
and the CLI do not change. Lazy imports keep ``--help`` and bad-URI errors fast, and turn a
missing optional dependency into an install hint instead of a traceback.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING

from initializers.errors import UsageError

if TYPE_CHECKING:
    from initializers.config import Settings
    from initializers.sources.base import Source

# scheme -> ("module:Class", install hint)
REGISTRY: dict[str, tuple[str, str]] = {
    "s3": ("initializers.sources.s3:S3Source", "pip install boto3"),
    "hf": ("initializers.sources.hf:HfSource", "pip install huggingface_hub"),
    "gs": ("initializers.sources.gcs:GcsSource", "pip install google-auth"),
    "az": ("initializers.sources.azure:AzureSource", "reinstall the initializers package"),
    "file": ("initializers.sources.local:LocalSource", "reinstall the initializers package"),
    "https": ("initializers.sources.web:WebSource", "pip install urllib3"),
    "http": ("initializers.sources.web:WebSource", "pip install urllib3"),
}

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.+)$")


def split_uri(uri: str) -> tuple[str, str]:
    """``scheme://rest`` → (scheme, rest), with the Kubeflow API's own validation rule."""
    match = _URI.match(uri)
    if not match:
        raise UsageError(
            f"storage URI {uri!r} is not of the form scheme://location "
            f"(supported: {', '.join(f'{s}://' for s in REGISTRY)})"
        )
    return match.group(1).lower(), match.group(2)


def open_source(settings: Settings) -> Source:
    """Instantiate the source for ``settings.storage_uri``."""
    scheme, rest = split_uri(settings.storage_uri)
    if scheme not in REGISTRY:
        hint = " (cache:// is not supported by these images)" if scheme == "cache" else ""
        raise UsageError(
            f"unsupported scheme {scheme}://{hint}; use one of "
            f"{', '.join(f'{s}://' for s in REGISTRY)}"
        )
    if scheme in ("http", "https") and _is_azure_blob_host(rest):
        scheme = "az"  # KServe's form of an Azure Blob URI
    target, install_hint = REGISTRY[scheme]
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"{scheme}:// needs a missing dependency ({exc.name}); {install_hint}"
        ) from None
    source_class: type[Source] = getattr(module, class_name)
    return source_class.from_settings(rest, settings)


def _is_azure_blob_host(rest: str) -> bool:
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1].split(":", 1)[0].lower()
    return host.endswith(".blob.core.windows.net")
