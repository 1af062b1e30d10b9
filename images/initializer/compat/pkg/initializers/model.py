"""Run our model initializer configured from the environment alone (STORAGE_URI, ...).

The Kubeflow SDK's local container backend starts `python -m pkg.initializers.model` in /app.
"""

import sys

from initializers.model import main

if __name__ == "__main__":
    sys.exit(main([]))
