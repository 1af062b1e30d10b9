"""Sources, registered by URI scheme and imported on first use.

Adding a scheme is one row here, one module implementing :class:`~.base.Source` and, when it has
options of its own, one module of option rows (:mod:`initializers.options`); the engine, the CLI
and the settings do not change. Lazy imports keep ``--help`` and bad-URI errors fast, and turn a
missing optional dependency into an install hint instead of a traceback; option modules are
light, so ``--help`` lists every scheme's options without loading any client library.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from initializers.errors import UsageError
from initializers.options import OptionGroup

if TYPE_CHECKING:
    from initializers.config import Settings
    from initializers.retry import RetryPolicy
    from initializers.sources.base import Source


@dataclass(frozen=True)
class Scheme:
    source: str  # "module:Class" of its Source
    install_hint: str  # what to install when the module's imports fail
    options: str | None = None  # the module whose OPTIONS are the rows only this source gets

    def option_group(self) -> OptionGroup | None:
        return importlib.import_module(self.options).OPTIONS if self.options else None


_SOURCES = "initializers.sources"
REGISTRY: dict[str, Scheme] = {
    "s3": Scheme(f"{_SOURCES}.s3:S3Source", "pip install boto3", f"{_SOURCES}.s3options"),
    "hf": Scheme(f"{_SOURCES}.hf:HfSource", "pip install huggingface_hub", f"{_SOURCES}.hfoptions"),
    "gs": Scheme(f"{_SOURCES}.gcs:GcsSource", "pip install google-auth", f"{_SOURCES}.gcsoptions"),
    "az": Scheme(
        f"{_SOURCES}.azure:AzureSource",
        "reinstall the initializers package",
        f"{_SOURCES}.azureoptions",
    ),
    "oci": Scheme(
        f"{_SOURCES}.oci:OciSource",
        "reinstall the initializers package",
        f"{_SOURCES}.ocioptions",
    ),
    "file": Scheme(f"{_SOURCES}.local:LocalSource", "reinstall the initializers package"),
    "https": Scheme(f"{_SOURCES}.web:WebSource", "pip install urllib3", f"{_SOURCES}.weboptions"),
    "http": Scheme(f"{_SOURCES}.web:WebSource", "pip install urllib3", f"{_SOURCES}.weboptions"),
}


def option_groups() -> list[OptionGroup]:
    """Every scheme's own option rows, once each, in the registry's order."""
    groups: list[OptionGroup] = []
    for scheme in REGISTRY.values():
        group = scheme.option_group()
        if group is not None and group not in groups:
            groups.append(group)
    return groups


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


def open_source(settings: Settings, retry: RetryPolicy | None = None) -> Source:
    """Instantiate the source for ``settings.storage_uri``, given the common options, its own
    and the run's retry policy (by default, the one the settings make)."""
    scheme, rest = split_uri(settings.storage_uri)
    if scheme not in REGISTRY:
        hint = " (cache:// is not supported by these images)" if scheme == "cache" else ""
        raise UsageError(
            f"unsupported scheme {scheme}://{hint}; use one of "
            f"{', '.join(f'{s}://' for s in REGISTRY)}"
        )
    if scheme in ("http", "https") and _is_azure_blob_host(rest):
        scheme = "az"  # KServe's form of an Azure Blob URI
    row = REGISTRY[scheme]
    module_name, class_name = row.source.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"{scheme}:// needs a missing dependency ({exc.name}); {row.install_hint}"
        ) from None
    source_class: type[Source] = getattr(module, class_name)
    own = row.option_group()
    return source_class.from_settings(
        rest, settings.for_source(own, retry or settings.retry_policy())
    )


def _is_azure_blob_host(rest: str) -> bool:
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1].split(":", 1)[0].lower()
    return host.endswith(".blob.core.windows.net")
