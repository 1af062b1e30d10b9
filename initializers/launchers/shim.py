"""What both shims share at the edge: their own options, the user's command, errors, exec.

Command line shape: ``kf-X [shim options] [--] COMMAND...``. Shim options come first; everything
from the first argument that is not a shim option (or after ``--``) is the user's, and reaches
the real launcher untouched, after the options the shim computed (so launcher options may come
before the script: ``kf-torchrun -- --max-restarts=3 train.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from initializers.environment import is_on, variables, write_termination_message
from initializers.errors import ExitCode, InitializerError, UsageError

log = logging.getLogger("initializers.launchers")

COMMON_HELP = """
Every option can also be set by the environment variable shown; flags beat env.

exit codes: the launcher's own once it runs; before that 2 = bad env/flags, 4 = required assets
still incomplete after the wait, 7 = peers unreachable after the wait, 1 = unexpected.
"""


def new_parser(prog: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """A parser with the options both shims take; each shim adds its own."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog + COMMON_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--require",
        action="append",
        metavar="PATH",
        help="asset folder that must hold a complete initializer output (its "
        ".initializer-manifest.json) before launch; repeatable (KF_REQUIRE_ASSETS=PATH,PATH)",
    )
    parser.add_argument(
        "--wait-timeout",
        type=float,
        metavar="SECONDS",
        help="how long to wait for those assets; 0 = look once (KF_WAIT_TIMEOUT, default 600)",
    )
    parser.add_argument(
        "--peer-timeout",
        type=float,
        metavar="SECONDS",
        help="how long to wait for peers: the torch master, every MPI node's sshd; pods of one "
        "job may start minutes apart (KF_PEER_TIMEOUT, default 600)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, print the topology and the command, but do not wait or launch",
    )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the user's command, passed on untouched"
    )
    return parser


def user_command(parsed: argparse.Namespace, prog: str, what: str) -> list[str]:
    """The user's command (``--`` separator removed), or a UsageError when there is none."""
    command = list(parsed.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError(f"no {what} given; usage: {prog} [options] [--] {what.upper()} [ARGS...]")
    return command


def run(prog: str, body: Callable[[], int]) -> int:
    """Run a shim body with logging to stderr; a typed error ends it with one line and its code."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        return body()
    except InitializerError as exc:
        return _fail(prog, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if is_on(variables(), "DEBUG"):
            log.exception("unexpected failure")
        return _fail(prog, f"unexpected {type(exc).__name__}: {exc}", ExitCode.UNEXPECTED)


def _fail(prog: str, message: str, code: int) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    write_termination_message(f"{prog}: {message}")
    return int(code)


def show_command(argv: Sequence[str], env_changes: Mapping[str, str]) -> None:
    """Log the exact command (and env the shim sets), copy-pasteable from ``kubectl logs``."""
    for name, value in env_changes.items():
        log.info("env %s=%s", name, shlex.quote(value))
    log.info("exec %s", shlex.join(argv))


def exec_launcher(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """Replace this process with the launcher: its exit code and signals become the job's."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(argv[0], list(argv), dict(env))
    except OSError as exc:
        raise UsageError(f"cannot start {argv[0]}: {exc.strerror}; check the image") from None
