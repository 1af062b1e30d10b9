"""A moto S3 server that checks signatures, in its own process, for the auth failure tests.

moto checks credentials only when told to, and globally: a separate process keeps that away from
the shared S3 servers the other tests use. One IAM user may do anything in S3; its key works,
any other key or a wrong secret is refused (InvalidAccessKeyId, SignatureDoesNotMatch).

    with locked_s3() as s3:          # or locked_s3("10.89.0.1") for a container bridge's gateway
        s3.client().create_bucket(Bucket="b")
        ... ACCESS_KEY_ID=s3.access_key  SECRET_ACCESS_KEY=s3.secret_key  ENDPOINT=s3.endpoint
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import boto3


@dataclass
class LockedS3:
    endpoint: str
    access_key: str
    secret_key: str

    def client(self) -> object:
        """A boto3 S3 client with the valid credentials."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )


@contextlib.contextmanager
def locked_s3(host: str = "127.0.0.1", timeout: float = 30) -> Iterator[LockedS3]:
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    url = f"http://{host}:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        setup = {
            "endpoint_url": url,
            "region_name": "us-east-1",
            "aws_access_key_id": "setup",
            "aws_secret_access_key": "setup",
        }
        iam = boto3.client("iam", **setup)
        iam.create_user(UserName="reader")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
        }
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        request = urllib.request.Request(
            f"{url}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(request, timeout=10).close()  # from now on, signatures count
        yield LockedS3(url, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
