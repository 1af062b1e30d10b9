"""Running a runtime's container on this machine the way a kubelet would run it in a pod.

No cluster is at hand, so the pieces a kubelet supplies are modelled, each explicitly:

* **the image**: argv is the container's ``command``/``args`` on top of the Dockerfile's
  ENTRYPOINT/CMD (read by :mod:`tests.runtimes.dockerfiles`); ``tini`` is left out, and a file the
  Dockerfile COPYs from this repository (the initializer entrypoint) runs from the repository.
  The image's ENV comes first, with PATH pointing at this machine's installed console scripts;
* **volume mounts**: each volume is a host folder and every env value that is an absolute path
  inside a mount is rewritten to the host folder, the one rewrite a bind mount does implicitly.
  The ``initializer`` claim is one folder shared by every pod of the TrainJob;
* **the user**: run by root, the process runs as the pod's and container's ``runAsUser`` /
  ``runAsGroup`` (the container's win), inside a user namespace that maps root to that UID: the
  image's entrypoint sees the non-root UID a kubelet would give it, while files stay reachable;
* **kubelet extras**: the termination message file lives in the pod's folder, and HOME is where
  the image's entrypoint falls back to on a read-only root (its /tmp mount);
* **this machine's safety**: ``AWS_EC2_METADATA_DISABLED`` so boto3 never probes a non-loopback
  address for credentials.

Everything else in the environment is exactly the container's env after the controller's merge.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from tests.runtimes import dockerfiles

Obj = dict[str, Any]
SCRIPTS_DIR = sysconfig.get_path("scripts")


@dataclass
class Pod:
    """One container's view of the filesystem: container mount path → host folder."""

    root: Path
    mounts: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def for_container(cls, container: Obj, root: Path, shared: dict[str, Path]) -> Pod:
        pod = cls(root)
        for mount in container.get("volumeMounts", []):
            host = shared.get(mount["name"]) or root / "volumes" / mount["name"]
            host.mkdir(parents=True, exist_ok=True)
            pod.mounts[mount["mountPath"]] = host
        return pod

    def host_path(self, container_path: str) -> Path | None:
        """Where ``container_path`` lives on this machine, or None outside every mount."""
        path = PurePosixPath(container_path)
        for mount in sorted(self.mounts, key=len, reverse=True):
            if path == PurePosixPath(mount) or path.is_relative_to(mount):
                return self.mounts[mount] / path.relative_to(mount)
        return None

    def translate_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with container paths (alone or in a comma-separated list) made host paths."""
        return {key: self._translate(value) for key, value in env.items()}

    def _translate(self, value: str) -> str:
        parts = value.split(",")
        if not all(part.startswith("/") for part in parts):
            return value
        hosts = [self.host_path(part) for part in parts]
        return ",".join(str(h) if h is not None else p for h, p in zip(hosts, parts, strict=True))


def image_argv(container: Obj, image: dockerfiles.Image) -> list[str]:
    """What the container executes: Kubernetes' command/args over ENTRYPOINT/CMD."""
    if container.get("command"):
        return [*container["command"], *container.get("args", [])]
    args = container.get("args", image.cmd or [])
    return [*(image.entrypoint or []), *args]


def host_argv(argv: list[str], image: dockerfiles.Image) -> list[str]:
    """``argv`` runnable here: without tini, repo files for files the image COPYs from it."""
    if argv and PurePosixPath(argv[0]).name in ("tini", "tini-static"):
        argv = argv[argv.index("--") + 1 :] if "--" in argv else argv[1:]
    origin = image.files.get(argv[0])
    if origin is not None:
        return ["/bin/sh", str(origin), *argv[1:]] if _is_shell_script(origin) else argv
    return argv


def _is_shell_script(path: Path) -> bool:
    return path.read_bytes()[:32].startswith((b"#!/bin/sh", b"#!/usr/bin/env sh"))


def run_as(pod_spec: Obj, container: Obj) -> tuple[int, int] | None:
    """(UID, GID) the kubelet starts ``container`` with, or None to keep the image's user."""
    merged = {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
    if merged.get("runAsUser") is None:
        return None
    return int(merged["runAsUser"]), int(merged.get("runAsGroup", 0))


def as_user(argv: list[str], user: tuple[int, int] | None) -> list[str]:
    """``argv`` run as ``user`` (a user namespace mapping this machine's root onto it).

    Only root needs it: the image's entrypoint does something else as root (it drops to another
    user), while any non-root user already takes its non-root branch, as ``user`` would.
    """
    if user is None or os.getuid() != 0 or user[0] == 0:
        return argv
    uid, gid = user
    return ["unshare", "--user", f"--map-user={uid}", f"--map-group={gid}", "--", *argv]


def base_env(image: dockerfiles.Image, pod: Pod, container: Obj) -> dict[str, str]:
    env = dict(image.env)
    env["PATH"] = f"{SCRIPTS_DIR}:/usr/local/bin:/usr/bin:/bin"
    read_only = (container.get("securityContext") or {}).get("readOnlyRootFilesystem")
    tmp = pod.host_path("/tmp")
    home = tmp if read_only and tmp is not None else pod.root / "home"
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    env["TERMINATION_LOG"] = str(pod.root / "termination-log")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


@dataclass
class Finished:
    code: int
    output: str
    max_rss_bytes: int
    termination_message: str


# A child's peak RSS counts the memory of the process it was forked from until it execs, so
# a big pytest process would inflate it: a small wrapper forks the container process and
# reports that child's own peak.
_MEASURED = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvpe(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


class Running:
    """A started container process; :meth:`wait` returns its exit code, output and peak RSS."""

    def __init__(self, argv: list[str], env: dict[str, str], pod: Pod, timeout: float):
        self.pod = pod
        self.log = pod.root / "output.log"
        self.rss_file = pod.root / "peak-rss"
        with self.log.open("wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _MEASURED, str(self.rss_file), *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=pod.root,
            )
        self._timer = threading.Timer(timeout, self.proc.kill)
        self._timer.start()

    def wait(self) -> Finished:
        self.proc.wait()
        self._timer.cancel()
        message = self.pod.root / "termination-log"
        return Finished(
            code=self.proc.returncode,
            output=self.log.read_text(errors="replace"),
            max_rss_bytes=int(self.rss_file.read_text()) if self.rss_file.exists() else 0,
            termination_message=message.read_text() if message.exists() else "",
        )


def start(
    container: Obj,
    env: dict[str, str],
    root: Path,
    shared: dict[str, Path],
    timeout: float = 120,
    user: tuple[int, int] | None = None,
) -> Running:
    """Start ``container`` (as merged by the controller) with its resolved ``env``, as ``user``
    (:func:`run_as`)."""
    target = dockerfiles.find_target(container["image"])
    if target is not None:
        image = dockerfiles.build(*target)
    elif container.get("command"):  # a user's trainer image: only its command is known
        image = dockerfiles.Image(dockerfiles.IMAGES_DIR / "unknown", None)
    else:
        raise FileNotFoundError(f"no Dockerfile under images/ builds {container['image']}")
    root.mkdir(parents=True, exist_ok=True)
    pod = Pod.for_container(container, root, shared)
    full_env = {**base_env(image, pod, container), **pod.translate_env(env)}
    argv = as_user(host_argv(image_argv(container, image), image), user)
    return Running(argv, full_env, pod, timeout)
