"""The options only the s3:// source receives: its endpoint, region, keys, role, who pays and
the customer key of SSE-C objects; and the headers those last two add to requests."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from initializers.errors import UsageError
from initializers.options import Option, OptionGroup, one_of, read_secret_file

REQUEST_PAYER_HEADER = "x-amz-request-payer"
SSE_C_PREFIX = "x-amz-server-side-encryption-customer-"


def request_headers(settings: Mapping[str, Any], reads_object: bool) -> dict[str, str]:
    """What every request says for these options (all x-amz-*, to be signed): who pays, and
    for a request that reads an object (HEAD, GET) the SSE-C customer key."""
    headers = {}
    if settings["request_payer"]:
        headers[REQUEST_PAYER_HEADER] = settings["request_payer"]
    key = settings["sse_customer_key"]
    if key and reads_object:
        digest = hashlib.md5(base64.b64decode(key), usedforsecurity=False).digest()
        headers[SSE_C_PREFIX + "algorithm"] = "AES256"
        headers[SSE_C_PREFIX + "key"] = key
        headers[SSE_C_PREFIX + "key-md5"] = base64.b64encode(digest).decode()
    return headers


def _finish(values: dict[str, Any]) -> None:
    secret_file = values.pop("secret_access_key_file")
    if secret_file is not None:
        values["secret_access_key"] = read_secret_file(secret_file, "secret access key")
    if bool(values["access_key_id"]) != bool(values["secret_access_key"]):
        raise UsageError(
            "set both ACCESS_KEY_ID and SECRET_ACCESS_KEY (or neither, to use the "
            "AWS credential chain)"
        )
    if values["anonymous"] and (values["access_key_id"] or values["role_arn"]):
        raise UsageError("--anonymous cannot be combined with access keys or --role-arn")
    key_file = values.pop("sse_customer_key_file")
    if key_file is not None:
        values["sse_customer_key"] = read_secret_file(key_file, "SSE-C customer key")
    if values["sse_customer_key"]:
        try:
            raw = base64.b64decode(values["sse_customer_key"], validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise UsageError(
                "SSE_CUSTOMER_KEY is not an SSE-C key: give the 256-bit AES key base64-encoded "
                "(44 characters), as the object was uploaded with"
            )


OPTIONS = OptionGroup(
    "s3",
    "S3",
    (
        Option(
            "endpoint",
            "--endpoint",
            ("ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            "S3-compatible endpoint URL (MinIO, R2, Ceph, ...; path-style unless "
            "--addressing-style says otherwise)",
            shown="AWS",
            locates=True,
        ),
        Option(
            "addressing_style",
            "--addressing-style",
            ("S3_ADDRESSING_STYLE",),
            "path (https://endpoint/bucket/key), virtual (https://bucket.endpoint/key), or auto: "
            "path on a custom endpoint, AWS's choice on AWS; unset, the AWS config file's "
            "s3.addressing_style where botocore reads it",
            one_of("path", "virtual", "auto"),
        ),
        Option(
            "region",
            "--region",
            ("REGION", "AWS_REGION", "AWS_DEFAULT_REGION"),
            "S3 region; 'auto' asks the bucket where it lives",
            default="auto",
        ),
        Option(
            "role_arn",
            "--role-arn",
            ("ROLE_ARN",),
            "IAM role to assume through STS before fetching (refreshed before it expires)",
        ),
        Option(
            "access_key_id",
            None,
            ("ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
            "S3 access key id",
            shown="AWS SDK chain",
        ),
        Option(
            "secret_access_key",
            None,
            ("SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
            "S3 secret key",
            shown="AWS SDK chain",
            secret=True,
        ),
        Option(
            "secret_access_key_file",
            "--secret-access-key-file",
            ("SECRET_ACCESS_KEY_FILE",),
            "file holding the S3 secret key",
            Path,
        ),
        Option(
            "request_payer",
            "--request-payer",
            ("REQUEST_PAYER",),
            "'requester' to read a Requester Pays bucket: every request says this account pays",
            one_of("requester"),
        ),
        Option(
            "sse_customer_key",
            None,
            ("SSE_CUSTOMER_KEY",),
            "SSE-C: the base64 AES-256 key the objects were uploaded with",
            secret=True,
        ),
        Option(
            "sse_customer_key_file",
            "--sse-customer-key-file",
            ("SSE_CUSTOMER_KEY_FILE",),
            "file holding the SSE-C key (base64)",
            Path,
        ),
        Option(
            "session_token",
            None,
            ("SESSION_TOKEN", "AWS_SESSION_TOKEN"),
            "S3 session token",
            secret=True,
        ),
    ),
    finish=_finish,
)
