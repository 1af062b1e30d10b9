"""Training stand-in that runs until SIGTERM, recording that the signal reached it.

Usage: wait_for_sigterm.py OUT_DIR; writes OUT_DIR/started, then OUT_DIR/got-sigterm on SIGTERM.
"""

import signal
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])


def on_term(signum, frame):
    (out / "got-sigterm").write_text("yes")
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
(out / "started").write_text("yes")
time.sleep(120)
sys.exit(0)
