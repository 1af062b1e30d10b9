"""The options only the az:// source receives: the account and its credentials."""

from __future__ import annotations

from pathlib import Path

from initializers.environment import parse_bool
from initializers.options import Option, OptionGroup

OPTIONS = OptionGroup(
    "az",
    "Azure",
    (
        Option(
            "azure_account",
            None,
            ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT"),
            "Azure storage account of az:// URIs",
            locates=True,
        ),
        Option(
            "azure_key",
            None,
            ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_KEY"),
            "Azure storage account key (Shared Key signing)",
            secret=True,
        ),
        Option(
            "azure_sas",
            None,
            ("AZURE_STORAGE_SAS_TOKEN",),
            "Azure SAS token (sv=...&sig=...)",
            secret=True,
        ),
        Option(
            "azure_connection_string",
            None,
            ("AZURE_STORAGE_CONNECTION_STRING",),
            "Azure storage connection string (account, key or SAS, endpoint: BlobEndpoint=, "
            "e.g. Azurite's)",
            secret=True,
        ),
        Option(
            "azure_client_id",
            None,
            ("AZURE_CLIENT_ID", "AZ_CLIENT_ID"),
            "Azure service principal or workload identity client id",
        ),
        Option("azure_tenant_id", None, ("AZURE_TENANT_ID", "AZ_TENANT_ID"), "Azure tenant id"),
        Option(
            "azure_client_secret",
            None,
            ("AZURE_CLIENT_SECRET", "AZ_CLIENT_SECRET"),
            "Azure service principal secret (Microsoft Entra client credentials)",
            secret=True,
        ),
        Option(
            "azure_federated_token_file",
            None,
            ("AZURE_FEDERATED_TOKEN_FILE",),
            "AKS workload identity token file (with AZURE_CLIENT_ID, AZURE_TENANT_ID, as its "
            "webhook sets them)",
            Path,
        ),
        Option(
            "azure_client_certificate",
            None,
            ("AZURE_CLIENT_CERTIFICATE_PATH",),
            "a service principal's certificate (PEM or PKCS12, with AZURE_CLIENT_ID and "
            "AZURE_TENANT_ID; azure-identity reads it and AZURE_CLIENT_CERTIFICATE_PASSWORD)",
        ),
        Option(
            "azure_identity_endpoint",
            None,
            ("IDENTITY_ENDPOINT", "MSI_ENDPOINT"),
            "the managed identity endpoint App Service, Azure Arc and Cloud Shell set "
            "(azure-identity reads it and its companions)",
        ),
        Option(
            "azure_managed_identity",
            "--azure-managed-identity",
            ("AZURE_MANAGED_IDENTITY",),
            "use the managed identity of the VM or AKS node (its instance metadata service; "
            "AZURE_CLIENT_ID picks a user-assigned one); App Service, Azure Arc and Cloud Shell "
            "are found without it",
            parse_bool,
            default=False,
            switch=True,
        ),
        Option(
            "azure_authority",
            None,
            ("AZURE_AUTHORITY_HOST",),
            "Microsoft Entra authority (sovereign clouds)",
            shown="https://login.microsoftonline.com",
        ),
    ),
)
