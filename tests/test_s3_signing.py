"""The native header signer must produce the signature botocore would: S3 checks it byte for
byte, and moto (the test server) does not check signatures at all."""

from __future__ import annotations

import datetime
from urllib.parse import quote, urlencode

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from initializers.sources.s3sign import S3HeaderSigner

KEYS = [
    "model/model-00001-of-00002.safetensors",
    "data/with space/and+plus=equals&amp.json",
    "ünïcödé/文件/~tilde/(parens)!'*.bin",
    "a//double/slash/./dot/../dotdot",
]


def botocore_headers(credentials: Credentials, url: str, headers: dict[str, str]) -> dict:
    request = AWSRequest(method="GET", url=url, headers=dict(headers))
    # botocore then signs UNSIGNED-PAYLOAD, as we do (S3 accepts either on a GET).
    request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    S3SigV4Auth(credentials, "s3", "eu-west-3").add_auth(request)
    return dict(request.headers)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("token", [None, "session-token/with+special="])
@pytest.mark.parametrize("host", ["bucket.s3.eu-west-3.amazonaws.com", "minio.local:9000"])
def test_header_signatures_match_botocores_for_the_same_request_and_time(key, token, host):
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    path = "/" + quote(key, safe="/~")
    extra = {"x-amz-checksum-mode": "ENABLED"}
    expected = botocore_headers(credentials, f"https://{host}{path}", extra)
    signed_at = datetime.datetime.strptime(expected["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.UTC
    )

    ours = S3HeaderSigner(credentials, "eu-west-3").sign(host, path, extra, now=signed_at)

    assert ours["Authorization"] == expected["Authorization"]
    assert ours["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert ours.get("X-Amz-Security-Token") == token
    assert ours["x-amz-checksum-mode"] == "ENABLED"


def test_refreshed_credentials_are_used_for_the_next_signature():
    class Rotating:
        def __init__(self):
            self.current = Credentials("AKID1", "secret-1").get_frozen_credentials()

        def get_frozen_credentials(self):
            return self.current

    credentials = Rotating()
    signer = S3HeaderSigner(credentials, "us-east-1")
    first = signer.sign("h", "/k", {})["Authorization"]
    credentials.current = Credentials("AKID2", "secret-2").get_frozen_credentials()
    second = signer.sign("h", "/k", {})["Authorization"]

    assert "Credential=AKID1/" in first
    assert "Credential=AKID2/" in second


@pytest.mark.parametrize(
    "query",
    [
        {"list-type": "2", "prefix": "data/with space/ünï+(1)", "encoding-type": "url"},
        {"list-type": "2", "prefix": "d/", "continuation-token": "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2="},
    ],
)
def test_a_listings_query_is_signed_as_botocore_signs_it(query):
    # Sent as the REST plane sends it ("/" left as is); S3 signs the canonical form, which
    # botocore takes from a URL already encoded that way.
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    host = "minio.local:9000"
    sent = urlencode(sorted(query.items()), quote_via=quote, safe="~")
    canonical = urlencode(sorted(query.items()), quote_via=quote, safe="-_.~")
    expected = botocore_headers(credentials, f"https://{host}/bucket/?{canonical}", {})
    signed_at = datetime.datetime.strptime(expected["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.UTC
    )

    ours = S3HeaderSigner(credentials, "eu-west-3").sign(host, f"/bucket/?{sent}", {}, signed_at)

    assert ours["Authorization"] == expected["Authorization"]
