"""az:// (and KServe's https://ACCOUNT.blob.core.windows.net form) against Azurite."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from initializers.config import AssetDefaults, load_settings
from initializers.manifest import find_problems, read_manifest
from initializers.sources import open_source
from initializers.sources.azure import DEV_ACCOUNT, DEV_KEY
from tests.conftest import tree
from tests.reliability.conftest import dataset
from tests.servers.tls import self_signed
from tests.servers.tokens import TokenServer

MIB = 1 << 20
FILES = dataset(51, {"config.json": 300, "model.safetensors": 40 * MIB, "tok/vocab.json": 70_000})
TENANT = "72f988bf-0000-4000-8000-2d7cd011db47"


def fill(azurite, container: str, prefix: str, files: dict[str, bytes], md5: bool = True) -> None:
    azurite.create_container(container)
    for name, body in files.items():
        azurite.put(container, f"{prefix}/{name}", body, md5=md5)


def env_for(uri: str, out: Path, **extra: str) -> dict[str, str]:
    return {"STORAGE_URI": uri, "OUTPUT_PATH": str(out), **extra}


def test_a_prefix_is_fetched_with_a_connection_string_verified_by_content_md5(
    azurite, container_name, run_initializer, tmp_path
):
    fill(azurite, container_name, "models/llama", FILES)
    out = tmp_path / "model"
    env = env_for(
        f"az://{container_name}/models/llama",
        out,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string(),
    )
    first = run_initializer("model", env=env)
    assert first.code == 0, first.output
    assert tree(out) == FILES
    assert find_problems(out) == []
    assert {r.checksum.split(":")[0] for r in read_manifest(out).files.values()} == {"md5-base64"}
    again = run_initializer("model", env=env)
    assert again.code == 0 and "already complete" in again.stderr, again.output
    assert DEV_KEY not in first.output + again.output


def test_an_account_key_under_kserves_name_signs_every_request(
    azurite, container_name, run_initializer, tmp_path
):
    fill(azurite, container_name, "d", {"a.bin": b"a" * 200_000})
    out = tmp_path / "out"
    env = env_for(
        f"az://{container_name}/d",
        out,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string(key=False),
        AZURE_STORAGE_ACCESS_KEY=DEV_KEY,
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(out) == {"a.bin": b"a" * 200_000}


def test_a_blob_without_content_md5_is_checked_by_size(
    azurite, container_name, run_initializer, tmp_path
):
    fill(azurite, container_name, "d", {"a.bin": b"b" * 5000}, md5=False)
    out = tmp_path / "out"
    env = env_for(
        f"az://{container_name}/d",
        out,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string(),
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert read_manifest(out).files["a.bin"].checksum is None


def test_a_blob_whose_content_md5_does_not_match_fails_with_exit_5(
    azurite, container_name, run_initializer, tmp_path
):
    fill(azurite, container_name, "d", {"a.bin": b"c" * 5000})
    azurite.set_md5(container_name, "d/a.bin", b"something else")
    out = tmp_path / "out"
    env = env_for(
        f"az://{container_name}/d", out, AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string()
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 5, result.output
    assert "checksum" in result.stderr
    assert tree(out) == {}


def container_sas(container: str, permissions: str = "rl") -> str:
    """A service SAS for the container (version 2020-12-06), signed with the dev account key."""
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    fields = [permissions, "", expiry, f"/blob/{DEV_ACCOUNT}/{container}", "", "", "http"]
    fields += ["2020-12-06", "c", "", "", "", "", "", "", ""]
    signature = hmac.new(base64.b64decode(DEV_KEY), "\n".join(fields).encode(), hashlib.sha256)
    sig = quote(base64.b64encode(signature.digest()).decode(), safe="")
    return f"sv=2020-12-06&se={quote(expiry)}&sr=c&sp={permissions}&spr=http&sig={sig}"


def test_a_sas_token_reads_the_container_and_never_reaches_the_logs(
    azurite, container_name, run_initializer, tmp_path
):
    fill(azurite, container_name, "d", {"a.bin": b"d" * 100_000, "b/c.txt": b"c"})
    sas = container_sas(container_name)
    out = tmp_path / "out"
    env = env_for(
        f"az://{container_name}/d",
        out,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string(key=False),
        AZURE_STORAGE_SAS_TOKEN=sas,
        DEBUG="1",
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(out) == {"a.bin": b"d" * 100_000, "b/c.txt": b"c"}
    assert sas.rsplit("sig=", 1)[1] not in result.output


def test_a_public_container_is_read_anonymously_and_a_private_one_says_how_to_authenticate(
    azurite, container_name, run_initializer, tmp_path
):
    azurite.create_container(container_name, public=True)
    azurite.put(container_name, "d/a.txt", b"public")
    anonymous = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(key=False)}
    ok = run_initializer(
        "dataset", env=env_for(f"az://{container_name}/d", tmp_path / "a", **anonymous)
    )
    assert ok.code == 0, ok.output
    assert tree(tmp_path / "a") == {"a.txt": b"public"}

    private = container_name + "-p"
    fill(azurite, private, "d", {"a.txt": b"private"})
    denied = run_initializer(
        "dataset", env=env_for(f"az://{private}/d", tmp_path / "b", **anonymous)
    )
    assert denied.code in (3, 4), denied.output  # Azurite answers 403; Azure may say 404
    assert (
        "AZURE_STORAGE_CONNECTION_STRING" in denied.stderr and "workload identity" in denied.stderr
    )


@pytest.mark.parametrize(
    ("uri", "extra", "code", "words"),
    [
        ("az://{c}-missing/d", {}, 4, "does not exist in account 'devstoreaccount1'"),
        ("az://{c}/nothing", {}, 4, "no blobs under"),
        ("az://{c}", {}, 2, "names a whole container"),
        ("az://Bad_Container/d", {}, 2, "is not a valid container name"),
        (
            "az://{c}/d",
            {"AZURE_STORAGE_ACCESS_KEY": base64.b64encode(b"wrong" * 8).decode()},
            3,
            "access denied",
        ),
    ],
)
def test_bad_azure_locations_and_keys_exit_with_a_clear_error(
    uri, extra, code, words, azurite, container_name, run_initializer, tmp_path
):
    fill(azurite, container_name, "d", {"a.txt": b"a"})
    connection = azurite.connection_string(key=not extra)
    env = env_for(
        uri.format(c=container_name),
        tmp_path / "out",
        AZURE_STORAGE_CONNECTION_STRING=connection,
        **extra,
    )
    result = run_initializer("dataset", env=env)
    assert result.code == code, result.output
    assert words in result.stderr
    assert "Traceback" not in result.output


def test_az_without_an_account_exits_2_naming_the_variable(run_initializer, tmp_path):
    result = run_initializer("dataset", env=env_for("az://models/d", tmp_path / "out"))
    assert result.code == 2, result.output
    assert "AZURE_STORAGE_ACCOUNT_NAME" in result.stderr


def test_kserves_https_blob_url_is_an_azure_source_with_the_account_from_the_host():
    uri = "https://mymodels.blob.core.windows.net/llama/v1/"
    settings = load_settings(
        AssetDefaults("model", Path("/tmp/unused")), ["--storage-uri", uri], env={}
    )
    source = open_source(settings)
    assert type(source).__name__ == "AzureSource"
    assert source.location.account == "mymodels" and source.location.prefix == "v1/"
    assert source.describe() == "az://llama/v1/"


# -- Microsoft Entra tokens (Azurite checks them over HTTPS with --oauth basic) -----------------


def jwt_for_storage(tenant: str) -> str:
    """A token with the claims Azurite's basic OAuth check reads (it does not check signatures)."""
    now = int(time.time())
    claims = {
        "aud": "https://storage.azure.com",
        "iss": f"https://sts.windows.net/{tenant}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 3600,
        "oid": "00000000-0000-0000-0000-000000000001",
        "tid": tenant,
    }

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"


@pytest.fixture
def entra() -> Iterator[Callable[[Callable[[dict[str, str]], bool]], TokenServer]]:
    """An Entra stand-in over https (msal takes no other authority), issuing Storage tokens
    Azurite's OAuth check accepts when ``accept`` says so."""
    started: list[TokenServer] = []

    def start(accept: Callable[[dict[str, str]], bool]) -> TokenServer:
        issue = lambda form: jwt_for_storage(TENANT) if accept(form) else None  # noqa: E731
        server = TokenServer(issue, https=True)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def trust_both(azurite, tokens: TokenServer, folder: Path) -> str:
    """One CA bundle for --ca-bundle: Azurite's certificate and the token stand-in's."""
    assert tokens.ca_file is not None
    bundle = folder / "ca-bundle.pem"
    bundle.write_text(azurite.ca_file.read_text() + tokens.ca_file.read_text())
    return str(bundle)


def entra_env(azurite, tokens: TokenServer, container: str, out: Path, **extra: str) -> dict:
    return env_for(
        f"az://{container}/d",
        out,
        AZURE_STORAGE_CONNECTION_STRING=azurite.connection_string(key=False),
        AZURE_AUTHORITY_HOST=tokens.url,
        AWS_CA_BUNDLE=trust_both(azurite, tokens, out.parent),
        **extra,
    )


@pytest.mark.parametrize("identity", ["service-principal", "workload-identity", "certificate"])
def test_an_entra_token_reads_the_container_over_https(
    identity, azurite_oauth, container_name, entra, run_initializer, tmp_path
):
    fill(azurite_oauth, container_name, "d", {"a.bin": b"e" * 150_000})
    assertion = tmp_path / "azure-identity-token"
    assertion.write_text("eyJ.projected-service-account-token.sig")
    if identity == "service-principal":
        tokens = entra(lambda form: form.get("client_secret") == "sp-secret-8c2e")
        extra = {
            "AZ_CLIENT_ID": "app-1",
            "AZ_TENANT_ID": TENANT,
            "AZ_CLIENT_SECRET": "sp-secret-8c2e",
        }
    elif identity == "workload-identity":
        tokens = entra(lambda form: form.get("client_assertion") == assertion.read_text())
        extra = {
            "AZURE_CLIENT_ID": "app-1",
            "AZURE_TENANT_ID": TENANT,
            "AZURE_FEDERATED_TOKEN_FILE": str(assertion),
        }
    else:  # a JWT signed with the certificate's key (the stand-in does not check signatures)
        tokens = entra(lambda form: form.get("client_assertion", "").count(".") == 2)
        certificate = tmp_path / "sp.pem"
        self_signed(tmp_path / "cert.pem", tmp_path / "key.pem")
        certificate.write_text(
            (tmp_path / "key.pem").read_text() + (tmp_path / "cert.pem").read_text()
        )
        extra = {
            "AZURE_CLIENT_ID": "app-1",
            "AZURE_TENANT_ID": TENANT,
            "AZURE_CLIENT_CERTIFICATE_PATH": str(certificate),
        }
    out = tmp_path / "out"
    env = entra_env(azurite_oauth, tokens, container_name, out, **extra)
    result = run_initializer("dataset", env=env)
    assert result.code == 0, result.output
    assert tree(out) == {"a.bin": b"e" * 150_000}
    assert len(tokens.forms) == 1 and tokens.paths == [f"/{TENANT}/oauth2/v2.0/token"]
    assert tokens.forms[0]["scope"] == "https://storage.azure.com/.default"
    assert "sp-secret-8c2e" not in result.output


def test_a_refused_service_principal_exits_3(
    azurite_oauth, container_name, entra, run_initializer, tmp_path
):
    fill(azurite_oauth, container_name, "d", {"a.bin": b"f"})
    tokens = entra(lambda form: False)
    out = tmp_path / "out"
    env = entra_env(
        azurite_oauth,
        tokens,
        container_name,
        out,
        AZURE_CLIENT_ID="app-1",
        AZURE_TENANT_ID=TENANT,
        AZURE_CLIENT_SECRET="wrong-secret-1d7f",
    )
    result = run_initializer("dataset", env=env)
    assert result.code == 3, result.output
    assert "cannot get an Azure Storage token (AADSTS7000215)" in result.stderr
    assert "wrong-secret-1d7f" not in result.output


@pytest.mark.parametrize("where", ["app-service", "instance-metadata"])
def test_a_managed_identity_token_reads_the_container(
    where, azurite_oauth, container_name, run_initializer, tmp_path
):
    """App Service (and Arc, Cloud Shell) name their endpoint in the environment; the VM's or
    AKS node's instance metadata service is asked only with --azure-managed-identity, here at a
    stand-in (AZURE_POD_IDENTITY_AUTHORITY_HOST), never at 169.254.169.254."""
    fill(azurite_oauth, container_name, "d", {"m.bin": b"m" * 70_000})
    tokens = TokenServer(lambda query: jwt_for_storage(TENANT))
    try:
        if where == "app-service":
            extra = {
                "IDENTITY_ENDPOINT": f"{tokens.url}/msi/token",
                "IDENTITY_HEADER": tokens.identity_header,
            }
        else:
            extra = {
                "AZURE_POD_IDENTITY_AUTHORITY_HOST": tokens.url,
                "AZURE_MANAGED_IDENTITY": "true",
                "AZURE_CLIENT_ID": "user-assigned-7",
            }
        out = tmp_path / "out"
        env = env_for(
            f"az://{container_name}/d",
            out,
            AZURE_STORAGE_CONNECTION_STRING=azurite_oauth.connection_string(key=False),
            AWS_CA_BUNDLE=str(azurite_oauth.ca_file),
            **extra,
        )
        result = run_initializer("dataset", env=env)
    finally:
        tokens.stop()
    assert result.code == 0, result.output
    assert tree(out) == {"m.bin": b"m" * 70_000}
    assert [r["resource"] for r in tokens.identity_requests] == ["https://storage.azure.com"]
    if where == "instance-metadata":
        assert tokens.identity_requests[0]["client_id"] == "user-assigned-7"
