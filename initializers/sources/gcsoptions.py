"""The options only the gs:// source receives: a service account key, an emulator."""

from __future__ import annotations

from initializers.options import Option, OptionGroup

OPTIONS = OptionGroup(
    "gs",
    "GCS",
    (
        Option(
            "gcs_key_json",
            None,
            ("GOOGLE_APPLICATION_CREDENTIALS_JSON",),
            "a GCS service account key's JSON itself (e.g. from a secretRef); "
            "GOOGLE_APPLICATION_CREDENTIALS names a key file",
            secret=True,
        ),
        Option(
            "gcs_key_file",
            None,
            ("GOOGLE_APPLICATION_CREDENTIALS",),
            "GCS service account key file (Application Default Credentials; also gcloud's "
            "credentials, GKE Workload Identity)",
            shown="ADC chain",
        ),
        Option(
            "gcs_emulator",
            None,
            ("STORAGE_EMULATOR_HOST",),
            "GCS emulator address (fake-gcs-server); anonymous unless a key is given",
        ),
    ),
)
