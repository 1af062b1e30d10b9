"""Run an initializer and SIGKILL it at one exact point, found by CPython audit events.

    python killpoint.py EVENT SUBSTRING N WHEN MODULE [ARGS...]

EVENT is ``os.rename`` (raised by os.rename and os.replace) or ``open`` (open and os.open).
SUBSTRING picks the events by path (the rename's destination, the file opened); at the Nth
matching event the process kills itself with SIGKILL — ``before`` doing it, or ``after`` doing
it (renames only: the rename is done here, then the process dies before the line after it).
Everything else is the real CLI, run as ``python -m MODULE ARGS...`` would run it.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading


def main() -> None:
    event, substring, nth, when, module, *args = sys.argv[1:]
    if when not in ("before", "after") or (when == "after" and event != "os.rename"):
        raise SystemExit(f"killpoint: cannot kill {when} {event}")
    target = int(nth)
    seen = 0
    lock = threading.RLock()  # the replace below re-enters the hook

    def hook(name: str, params: tuple) -> None:
        nonlocal seen
        if name != event:
            return
        path = params[1] if name == "os.rename" else params[0]
        if substring not in str(path):
            return
        with lock:
            seen += 1
            if seen != target:
                return
            if when == "after":
                seen += 1  # the replace below raises this event again
                os.replace(params[0], params[1])
            os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
