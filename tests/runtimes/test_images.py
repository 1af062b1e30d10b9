"""Every image a runtime names is built by this repository (or is a documented public image),
every command a container runs exists in its image, and each securityContext matches the image's
user. Images are read from their Dockerfiles (no registry is reachable): see dockerfiles.py."""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

import pytest

from initializers.launchers import mpirun, torchrun
from tests.runtimes import dockerfiles, manifests, pods, render

OUR_PREFIX = "ghcr.io/kubeflow-initializers/"
# Public images a runtime may name, with where they are documented and what they provide.
DOCUMENTED_PUBLIC = {
    "ghcr.io/kubeflow/trainer/torchtune-trainer": (
        "https://www.kubeflow.org/docs/components/trainer/user-guides/builtin-trainer/torchtune/",
        {"tune"},
    ),
}
SHIM_FLAGS_WITH_VALUE = {  # what the shims' own parsers say, so a new flag cannot be missed
    option
    for parser in (torchrun.build_parser(), mpirun.build_parser())
    for action in parser._actions
    if action.option_strings and action.nargs != 0
    for option in action.option_strings
}
# Trainer images being written in another issue: until their folder exists, their checks skip
# with this reason; once it exists every check below runs in full.
PENDING_IMAGES = {
    "torch-runtime": "Python + PyTorch + kf-torchrun",
    "mpi-runtime": "Open MPI + sshd on 2222 as mpiuser (UID 1000) + kf-mpirun",
}

RENDERED = render.render_subset(manifests.RUNTIMES_DIR)
PRUNE = manifests.asset_cache_object("CronJob")  # the asset store's prune job runs our image too
CONTAINERS = [
    (runtime, rjob, container)
    for runtime in RENDERED
    for rjob, container in manifests.all_containers(runtime)
] + [
    (PRUNE, job, container)
    for job in [manifests.cron_job_as_replicated_job(PRUNE)]
    for container in manifests.containers(job)
]
IDS = [f"{r['metadata']['name']}/{j['name']}/{c['name']}" for r, j, c in CONTAINERS]
per_container = pytest.mark.parametrize(("runtime", "rjob", "container"), CONTAINERS, ids=IDS)


def _name(image: str) -> str:
    return render.split_image(image)[0]


def _ours(image: str) -> bool:
    return _name(image).startswith(OUR_PREFIX)


def _image(container: dict) -> dockerfiles.Image:
    short = _name(container["image"]).removeprefix(OUR_PREFIX)
    if short in PENDING_IMAGES and not (dockerfiles.IMAGES_DIR / short).exists():
        pytest.skip(f"waits for images/{short}/Dockerfile ({PENDING_IMAGES[short]})")
    target = dockerfiles.find_target(_name(container["image"]))
    assert target is not None, (
        f"{container['image']}: no images/*/Dockerfile builds it (a stage named "
        f"{_name(container['image']).removeprefix(OUR_PREFIX)} or images/<name>/Dockerfile)"
    )
    return dockerfiles.build(*target)


def programs(argv: list[str], image: dockerfiles.Image) -> list[str]:
    """Every program ``argv`` starts in the image: through tini, the initializer entrypoint
    (which execs a command it is given), ``sh -c`` scripts (their ``exec`` targets) and the
    launcher shims (the program after their own flags)."""
    found = []
    while argv:
        program, rest = argv[0], argv[1:]
        found.append(program)
        name = PurePosixPath(program).name
        if name in ("tini", "tini-static"):
            argv = rest[rest.index("--") + 1 :] if "--" in rest else rest
        elif image.files.get(program) is not None and rest and not rest[0].startswith("-"):
            argv = rest  # the initializer entrypoint runs a command it is given
        elif name in ("sh", "bash") and rest[:1] == ["-c"]:
            found += re.findall(r"\bexec\s+(\S+)", rest[1])
            argv = []
        elif name in ("kf-torchrun", "kf-mpirun"):
            argv = _after_shim_flags(rest)
            if argv[:1] == ["-m"] or (argv and name == "kf-torchrun"):
                argv = []  # torchrun runs a Python script or module, checked separately
        else:
            argv = []
    return found


def _after_shim_flags(args: list[str]) -> list[str]:
    index = 0
    while index < len(args) and args[index].startswith("--"):
        index += 1 if "=" in args[index] or args[index] not in SHIM_FLAGS_WITH_VALUE else 2
    if index < len(args) and args[index] == "--":
        index += 1
    return args[index:]


@per_container
def test_runtime_images_are_built_here_or_documented_public_images(runtime, rjob, container):
    if not _ours(container["image"]):
        assert _name(container["image"]) in DOCUMENTED_PUBLIC, container["image"]
        return
    _image(container)


@per_container
def test_every_command_a_container_runs_exists_in_its_image(runtime, rjob, container):
    if not _ours(container["image"]):
        _, provides = DOCUMENTED_PUBLIC[_name(container["image"])]
        assert container["command"][0] in provides
        return
    image = _image(container)
    argv = pods.image_argv(container, image)
    assert argv, f"{container['image']} has no ENTRYPOINT and the container no command"
    for program in programs(argv, image):
        assert image.which(program), (
            f"{program} is not in {container['image']} ({image.dockerfile})"
        )
    if "-f" in argv and PurePosixPath(argv[0]).name == "sshd":
        config = argv[argv.index("-f") + 1]
        made = config in image.files or config in image.dockerfile.read_text()
        assert made, f"{image.dockerfile} neither copies nor writes sshd's config {config}"
    args = _after_shim_flags(container.get("args", []))
    if container.get("command") == ["kf-torchrun"] and args[:1] == ["-m"]:
        module = args[1].split(".")[0]
        assert module in image.modules, f"python module {module} is not in {container['image']}"


@per_container
def test_security_context_runs_as_the_image_user(runtime, rjob, container):
    if not _ours(container["image"]):
        return
    image = _image(container)
    pod = manifests.pod_spec(rjob)
    uid, gid = image.uid_gid

    def effective(key: str):
        own = (container.get("securityContext") or {}).get(key)
        return own if own is not None else (pod.get("securityContext") or {}).get(key)

    if uid == 0:
        # An image that starts as root only to hand a volume over (the initializers') must be
        # given its user: with runAsNonRoot and no runAsUser, the kubelet refuses to start a
        # container whose image user is 0 (CreateContainerConfigError).
        assert effective("runAsNonRoot") is True, "a pod must not start the image as root"
        users = {number for number, _ in image.users.values() if number != 0}
        assert effective("runAsUser") in users, f"not one of the image's users {users}"
        assert effective("runAsGroup") in (None, 0), "group 0 holds the image user's HOME"
        return
    assert effective("runAsUser") in (None, uid), f"the image runs as {uid}"
    if effective("runAsGroup") is not None:
        assert effective("runAsGroup") == gid


def test_initializer_image_entrypoint_finds_a_writable_home_on_a_read_only_root():
    """The runtimes set readOnlyRootFilesystem on the initializers; the image supports it by
    moving HOME/TMPDIR to a writable mount, which its entrypoint must still do."""
    for target in ("dataset-initializer", "model-initializer"):
        image = dockerfiles.build(*dockerfiles.find_target(target))
        entry = next(p for p in (image.entrypoint or []) if image.files.get(p) is not None)
        script = image.files[entry].read_text()
        assert "HOME=/tmp" in script and "writable" in script


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["/usr/local/bin/tini", "-g", "--", "/bin/sh", "-c", "x; exec model-initializer"],
            ["/usr/local/bin/tini", "/bin/sh", "model-initializer"],
        ),
        (["kf-mpirun", "--require", "/workspace/model", "hostname"], ["kf-mpirun", "hostname"]),
        (["kf-torchrun", "-m", "torch.utils.collect_env"], ["kf-torchrun"]),
    ],
)
def test_programs_follows_wrappers_to_the_programs_they_start(argv, expected):
    image = dockerfiles.Image(dockerfiles.IMAGES_DIR / "none", None)
    assert programs(argv, image) == expected


def test_shell_scripts_in_runtimes_parse_as_posix_shell():
    for runtime in RENDERED:
        for _, container in manifests.all_containers(runtime):
            argv = [*container.get("command", []), *container.get("args", [])]
            if "-c" in argv:
                script = argv[argv.index("-c") + 1]
                shlex.split(script)  # balanced quotes
                assert script.count("if ") == script.count("fi")
