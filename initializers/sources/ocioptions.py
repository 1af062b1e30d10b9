"""The options only the oci:// source receives: the platform, registries on plain http, and
the registry credentials (:mod:`initializers.sources.ociauth` says where else it looks)."""

from __future__ import annotations

import re

from initializers.options import Option, OptionGroup

_PLATFORM = re.compile(r"^[a-z0-9]+/[a-z0-9_]+(?:/[a-z0-9]+)?$")


def parse_platform(value: str) -> str:
    if not _PLATFORM.match(value):
        raise ValueError("expected OS/ARCH or OS/ARCH/VARIANT, e.g. linux/amd64 or linux/arm64/v8")
    return value


def parse_hosts(value: str) -> tuple[str, ...]:
    hosts = tuple(host.strip().lower() for host in value.split(",") if host.strip())
    if any("/" in host for host in hosts):
        raise ValueError("expected registry hosts (host or host:port), comma-separated")
    return hosts


OPTIONS = OptionGroup(
    "oci",
    "OCI registries",
    (
        Option(
            "oci_platform",
            "--platform",
            ("OCI_PLATFORM",),
            "the platform whose manifest is taken from an image index (multi-platform image)",
            parse_platform,
            default="linux/amd64",
        ),
        Option(
            "oci_insecure_registries",
            "--insecure-registry",
            ("OCI_INSECURE_REGISTRIES",),
            "registries (host or host:port, comma-separated) spoken to over plain http",
            parse_hosts,
            default=(),
        ),
        Option("oci_username", None, ("OCI_USERNAME",), "registry username"),
        Option(
            "oci_password",
            None,
            ("OCI_PASSWORD",),
            "registry password or access token (with OCI_USERNAME)",
            secret=True,
        ),
        Option(
            "oci_docker_config_json",
            None,
            ("OCI_DOCKERCONFIGJSON", ".dockerconfigjson"),
            "a Docker config's JSON, e.g. an imagePullSecret's .dockerconfigjson",
            secret=True,
        ),
        Option(
            "oci_auth_file",
            None,
            ("REGISTRY_AUTH_FILE",),
            "a Docker config file with registry credentials (podman's auth.json)",
        ),
        Option(
            "oci_docker_config",
            None,
            ("DOCKER_CONFIG",),
            "a folder whose config.json holds registry credentials (then ~/.docker/config.json)",
        ),
    ),
)
