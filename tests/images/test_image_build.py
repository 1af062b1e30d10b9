"""The built images themselves: user, labels, contents, pinned dependencies, size."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from tests.images.conftest import BUILD_TIMEOUT, IMAGE_UID, ROOT, podman

pytestmark = [pytest.mark.images, pytest.mark.timeout(BUILD_TIMEOUT + 300)]
KINDS = ("dataset", "model")
MiB = 1 << 20


def inspect(image: str) -> dict:
    return json.loads(podman("image", "inspect", image).stdout)[0]


# What a command run by the image sees of its own identity and privileges.
IDENTITY = "id -u; id -g; id -G; grep -E '^(CapPrm|CapEff|NoNewPrivs):' /proc/self/status | cut -f2"


@pytest.mark.parametrize("kind", KINDS)
def test_image_starts_as_root_but_runs_everything_as_its_non_root_user(images, podman_run, kind):
    # USER 0 only so that the entrypoint can hand a volume over; with no volume mounted (the
    # owner is root) the command runs as 65532:0, without capabilities or a way to regain them.
    assert inspect(images[kind])["Config"]["User"] == "0:0"
    result = podman_run(images[kind], "sh", "-c", IDENTITY)
    assert result.code == 0, result.output
    uid, gid, groups, permitted, effective, no_new_privs = result.stdout.split()
    assert (uid, gid, groups) == (str(IMAGE_UID), "0", "0")
    assert int(permitted, 16) == int(effective, 16) == 0
    assert no_new_privs == "1"


@pytest.mark.parametrize("kind", KINDS)
def test_image_started_as_a_user_stays_that_user(images, podman_run, kind):
    result = podman_run(images[kind], "sh", "-c", IDENTITY, options=("--user", "4321:0"))
    assert result.code == 0, result.output
    uid, gid, groups, _, _, no_new_privs = result.stdout.split()
    assert (uid, gid, groups, no_new_privs) == ("4321", "0", "0", "0"), "nothing changed"


@pytest.mark.parametrize("kind", KINDS)
def test_image_carries_oci_labels_for_source_version_and_licence(images, kind):
    labels = inspect(images[kind])["Config"]["Labels"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == f"{kind}-initializer"
    assert labels["org.opencontainers.image.source"]
    assert labels["org.opencontainers.image.revision"]


@pytest.mark.parametrize("kind", KINDS)
def test_entrypoint_is_tini_in_front_of_the_initializer(images, kind):
    config = inspect(images[kind])["Config"]
    assert config["Entrypoint"][0] == "/usr/local/bin/tini"
    assert config["Entrypoint"][-1] == "/usr/local/bin/initializer-entrypoint"
    assert config["WorkingDir"] == "/app"


PROBE = r"""
import importlib.util, os, shutil
problems = [name for name in ("pip", "setuptools", "wheel") if importlib.util.find_spec(name)]
problems += [tool for tool in ("pip", "pip3", "gcc", "cc", "make", "uv") if shutil.which(tool)]
problems += [p for p in ("/src", "/tmp/requirements.lock", "/root/.cache/pip") if os.path.exists(p)]
problems += [p for p in ("/var/lib/apt/lists",) if os.path.isdir(p) and any(
    n != "lock" and n != "partial" and n != "auxfiles" for n in os.listdir(p))]
print("\n".join(problems))
"""


@pytest.mark.parametrize("kind", KINDS)
def test_final_image_holds_no_pip_build_tools_sources_or_caches(images, podman_run, kind):
    result = podman_run(images[kind], "python", "-c", PROBE)
    assert result.code == 0, result.output
    assert result.stdout.split() == []


LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m; "
    "print('\\n'.join(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions()))"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_installed_dependencies_are_exactly_the_locked_versions(images, podman_run):
    lock = (ROOT / "images" / "initializer" / "requirements.lock").read_text()
    locked = {
        canonical(name): version
        for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", lock, re.M)
    }
    locked.pop("setuptools")  # builds the package, then leaves the image
    result = podman_run(images["model"], "python", "-c", LIST_DISTRIBUTIONS)
    assert result.code == 0, result.output
    installed = {
        canonical(name): version
        for name, version in (line.split("==") for line in result.stdout.split())
    }
    project = canonical(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"])
    assert installed.pop(project)
    assert installed == locked


@pytest.mark.parametrize("kind", KINDS)
def test_image_adds_under_100_mib_to_the_python_base(images, kind):
    image = inspect(images[kind])
    size = image["Size"]
    base = inspect(image["Config"]["Labels"]["org.opencontainers.image.base.name"])["Size"]
    print(f"{images[kind]}: {size / MiB:.0f} MiB ({(size - base) / MiB:.0f} MiB over the base)")
    assert size - base < 100 * MiB, f"image grew to {size / MiB:.0f} MiB"


def test_botocore_keeps_the_models_of_s3_and_the_credential_chain_only(images, podman_run):
    script = (
        "import botocore.session as s; session = s.get_session(); "
        "[session.create_client(n, region_name='us-east-1', aws_access_key_id='k', "
        "aws_secret_access_key='s') for n in ('s3', 'sts', 'sso', 'sso-oidc', 'signin')]; "
        "print(' '.join(sorted(session.get_available_services())))"
    )
    result = podman_run(images["model"], "-c", script, options=("--entrypoint", "python"))
    assert result.code == 0, result.output
    assert result.stdout.split() == ["s3", "signin", "sso", "sso-oidc", "sts"]
