"""KServe's storage initializer (PyPI ``kserve-storage``): ``Storage.download(uri, out_dir)``.

As its container entrypoint calls it; endpoint and credentials come from the environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...; ``HF_ENDPOINT`` for ``hf://``), patterns from
``STORAGE_IGNORE_PATTERNS`` / ``STORAGE_ALLOW_PATTERNS``. Runs in its own venv (``.bench/kserve``).
"""

from __future__ import annotations

import sys

from kserve_storage import Storage


def main() -> int:
    uri, out_dir = sys.argv[1], sys.argv[2]
    Storage.download(uri, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
