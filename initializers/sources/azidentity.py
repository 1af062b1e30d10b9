"""Microsoft Entra tokens for Azure Storage, from azure-identity's credentials.

As botocore serves AWS and google-auth serves GCS, azure-identity serves Azure: a service
principal's secret (``ClientSecretCredential``), AKS workload identity
(``WorkloadIdentityCredential``, its token file re-read as the kubelet rotates it), a client
certificate or the other ``AZURE_*`` forms (``EnvironmentCredential``), and managed identity
(``ManagedIdentityCredential``: App Service, Azure Arc and Cloud Shell find their endpoint in the
environment; the instance metadata service of a VM or an AKS node only when asked for, with
``--azure-managed-identity``). They are tried in that order, first that applies wins.

Only a run with one of these configured asks for a token; without any, a container is read
anonymously (public containers), and nothing probes a metadata address. Instance discovery is
off: the authority is the one given (``AZURE_AUTHORITY_HOST``), never looked up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from initializers.errors import AuthError, TransientError
from initializers.options import SourceSettings

SCOPE = "https://storage.azure.com/.default"
REFRESH_BEFORE = 300  # seconds before its expiry a token is replaced


def identity_configured(settings: SourceSettings) -> bool:
    """Whether the run has an Entra identity to use (else: anonymous, as today)."""
    return bool(_configured(settings))


def _configured(settings: SourceSettings) -> list[str]:
    """The credentials these settings configure, in the module's order (nothing imported)."""
    pair = settings.azure_client_id and settings.azure_tenant_id
    kinds = {
        "secret": pair and settings.azure_client_secret,
        "workload": pair and settings.azure_federated_token_file,
        "certificate": pair and settings.azure_client_certificate,
        "managed": settings.azure_managed_identity or settings.azure_identity_endpoint,
    }
    return [kind for kind, given in kinds.items() if given]


class IdentityToken:
    """Signs requests with a bearer token from the first credential that applies."""

    def __init__(self, settings: SourceSettings) -> None:
        self._credential = _chain(settings)
        self._token = ""
        self._expires = 0.0
        self._lock = threading.Lock()

    def headers(self, method: str, url: str, headers: Mapping[str, str]) -> dict[str, str]:
        return {**headers, "Authorization": f"Bearer {self._current()}"}

    def _current(self) -> str:
        with self._lock:
            if time.time() > self._expires - REFRESH_BEFORE:
                self._refresh()
            return self._token

    def _refresh(self) -> None:
        from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

        try:
            token = self._credential.get_token(SCOPE)
        except ClientAuthenticationError as exc:
            raise AuthError(
                f"cannot get an Azure Storage token ({_reason(exc)}); check AZURE_TENANT_ID, "
                "AZURE_CLIENT_ID and the client secret, workload identity federation or the "
                "managed identity's role assignment"
            ) from None
        except ServiceRequestError:
            raise TransientError("Azure credentials: the token endpoint did not answer") from None
        self._token, self._expires = token.token, float(token.expires_on)


def _chain(settings: SourceSettings) -> Any:
    """azure-identity's credentials that apply to these settings, in the module's order."""
    logging.getLogger("azure").setLevel(logging.ERROR)  # ours says why; its logs repeat it
    from azure.identity import (
        ChainedTokenCredential,
        ClientSecretCredential,
        EnvironmentCredential,
        ManagedIdentityCredential,
        WorkloadIdentityCredential,
    )

    common: dict[str, Any] = {"disable_instance_discovery": True}
    if settings.azure_authority:
        common["authority"] = settings.azure_authority
    if settings.ca_bundle:
        common["connection_verify"] = settings.ca_bundle
    client, tenant = settings.azure_client_id, settings.azure_tenant_id
    made = {
        "secret": lambda: ClientSecretCredential(
            tenant, client, settings.azure_client_secret, **common
        ),
        "workload": lambda: WorkloadIdentityCredential(
            tenant_id=tenant,
            client_id=client,
            token_file_path=str(settings.azure_federated_token_file),
            **common,
        ),
        "certificate": lambda: EnvironmentCredential(**common),
        "managed": lambda: ManagedIdentityCredential(
            client_id=client,
            **({"connection_verify": settings.ca_bundle} if settings.ca_bundle else {}),
        ),
    }
    members = [made[kind]() for kind in _configured(settings)]
    # One member alone, not a chain of one: its own error is the one to show.
    return members[0] if len(members) == 1 else ChainedTokenCredential(*members)


def _reason(exc: Exception) -> str:
    """The error code Entra put in its description (``AADSTS7000215``: msal passes on the
    description, not the OAuth error), else the first line of the message, short (it never
    holds the secret: a token endpoint does not echo it)."""
    text = str(getattr(exc, "message", "") or exc)
    for code in ("AADSTS", "invalid_grant", "invalid_client", "unauthorized_client"):
        if code in text:
            start = text.index(code)
            return text[start : start + 80].split()[0].rstrip(".,:;")
    return text.splitlines()[0][:80] if text else type(exc).__name__
