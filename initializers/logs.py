"""Logging for ``kubectl logs`` and log pipelines, configured once by the CLI.

Text lines carry a UTC timestamp and level; ``--log-format json`` emits one JSON object per
line (progress lines add a ``progress`` object). A filter masks every known secret in every
record, as a last line of defence behind messages that never include them.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable

NOISY = ("botocore", "boto3", "urllib3", "s3transfer", "huggingface_hub", "httpx2", "filelock")


class RedactSecrets(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = [s for s in secrets if s and len(s) >= 4]

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            record.msg = self.redact(record.getMessage())
            record.args = None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        progress = getattr(record, "progress", None)
        if progress:
            body["progress"] = progress
        if record.exc_info:
            body["traceback"] = self.formatException(record.exc_info)
        return json.dumps(body)


class TextFormatter(logging.Formatter):
    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s", "%Y-%m-%dT%H:%M:%SZ")


def configure(log_format: str, debug: bool, secrets: Iterable[str]) -> RedactSecrets:
    """Send our records to stderr in the chosen format; quiet the libraries' chatter."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    redactor = RedactSecrets(secrets)
    handler.addFilter(redactor)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("initializers").setLevel(logging.DEBUG if debug else logging.INFO)
    for name in NOISY:  # their DEBUG lines print request URLs, which may be presigned
        logging.getLogger(name).setLevel(logging.WARNING)
    return redactor
