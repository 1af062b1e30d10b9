"""Run our dataset initializer configured from the environment alone (STORAGE_URI, ...).

The Kubeflow SDK's local container backend starts `python -m pkg.initializers.dataset` in /app.
"""

import sys

from initializers.dataset import main

if __name__ == "__main__":
    sys.exit(main([]))
