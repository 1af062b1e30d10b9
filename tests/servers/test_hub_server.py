"""The local Hub server, checked with the real huggingface_hub client (and raw HTTP for ranges).

Expected hashes are computed here independently of the server (git blob sha1, sha256).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import socket
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import urllib3
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from tests.servers.hub import Fault, HubServer, fail_times

MiB = 1024 * 1024
TOKEN = "hf_test_reader"  # may read the private repo and accepted the gated repo's conditions
OTHER = "hf_test_outsider"  # a valid token without access to either
_rng = random.Random(1234)
WEIGHTS = _rng.randbytes(3 * MiB + 7)  # LFS by pattern and size; served from disk
BLOB = _rng.randbytes(MiB + 3)  # LFS by size only (no LFS pattern matches *.dat)
PARQUET = _rng.randbytes(200_000)  # LFS by pattern only
MODEL = {
    "config.json": b'{"model_type": "tiny"}',
    "tokenizer.json": b'{"vocab": {"a": 0}}',
    "model.safetensors": WEIGHTS,
    "weights/blob.dat": BLOB,
    "sub dir/notes \u00fc.txt": "unicode and spaces \u00fc".encode(),
}
MODEL_V1 = {"config.json": b'{"model_type": "old"}', "model.safetensors": b"old weights"}
DATASET = {
    "README.md": b"# data\n",
    "data/train-00000.parquet": PARQUET,
    "data/test.jsonl": b'{"x": 1}\n',
}
SECRET = {"config.json": b'{"secret": true}', "model.safetensors": b"secret weights"}


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def lfs_pointer_id(data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
    return git_blob_id(pointer.encode())


@pytest.fixture(autouse=True)
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean client environment: no Xet, no saved token, a private HF_HOME, no progress bars."""
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubServer]:
    weights = tmp_path / "weights-on-disk.bin"
    weights.write_bytes(WEIGHTS)
    server = HubServer(lfs_threshold=MiB, tree_page_size=2)
    server.tokens = {TOKEN, OTHER}
    server.add_repo(
        "org/model", {**MODEL, "model.safetensors": weights}, revisions={"v1-branch": MODEL_V1}
    )
    server.tag("org/model", "v1.0", "v1-branch")
    server.add_repo("org/data", DATASET, repo_type="dataset")
    server.add_repo("org/private", SECRET, private=True, access={TOKEN})
    server.add_repo("org/gated", SECRET, gated="manual", access={TOKEN})
    with server:
        yield server
    assert server.errors == [], "the server crashed while handling a request"


@pytest.fixture
def http() -> urllib3.PoolManager:
    """Raw HTTP that follows redirects (dropping Authorization across origins), never retries."""
    return urllib3.PoolManager(retries=urllib3.Retry(total=None, connect=0, read=0, redirect=3))


def file_ids(api: HfApi, repo_id: str, revision: str) -> dict[str, str]:
    """path -> blob id of every file at a revision."""
    tree = api.list_repo_tree(repo_id, recursive=True, revision=revision)
    return {e.path: e.blob_id for e in tree if isinstance(e, RepoFile)}


def read_tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    }


# -- repo info and tree listing ----------------------------------------------------------------


def test_repo_info_resolves_branches_tags_and_the_default_branch_to_commit_shas(hub):
    api = HfApi(endpoint=hub.endpoint, token=False)
    main, v1 = hub.sha("org/model"), hub.sha("org/model", "v1-branch")
    assert len(main) == 40 and len(v1) == 40 and main != v1
    assert api.repo_info("org/model").sha == main
    assert api.repo_info("org/model", revision="main").sha == main
    assert api.repo_info("org/model", revision="v1-branch").sha == v1
    assert api.repo_info("org/model", revision="v1.0").sha == v1
    assert api.repo_info("org/model", revision=v1).sha == v1
    info = api.repo_info("org/model")
    assert sorted(s.rfilename for s in info.siblings) == sorted(MODEL)
    assert (info.private, info.gated, info.id) == (False, False, "org/model")
    dataset = api.repo_info("org/data", repo_type="dataset")
    assert dataset.sha == hub.sha("org/data", repo_type="dataset")
    assert sorted(s.rfilename for s in dataset.siblings) == sorted(DATASET)


def test_repo_info_with_expand_returns_only_the_properties_asked_for(hub):
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    info = api.repo_info("org/gated", expand=["sha", "gated"])
    assert (info.sha, info.gated) == (hub.sha("org/gated"), "manual")
    assert info.siblings is None and info.private is None  # no file list: none was asked for
    listed = api.dataset_info("org/data", expand=["siblings"])
    assert sorted(s.rfilename for s in listed.siblings) == sorted(DATASET)


def test_repo_info_with_blobs_reports_sizes_and_lfs_checksums(hub):
    info = HfApi(endpoint=hub.endpoint, token=False).model_info("org/model", files_metadata=True)
    by_name = {s.rfilename: s for s in info.siblings}
    assert by_name["config.json"].size == len(MODEL["config.json"])
    assert by_name["config.json"].lfs is None
    assert by_name["model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()


def test_repo_info_reports_private_and_gated_flags_to_readers(hub):
    api = HfApi(endpoint=hub.endpoint, token=TOKEN)
    assert api.repo_info("org/private").private is True
    assert api.repo_info("org/gated").gated == "manual"


def test_list_repo_tree_paginates_and_reports_sizes_blob_ids_and_lfs_sha256(hub):
    api = HfApi(endpoint=hub.endpoint, token=False)
    entries = list(api.list_repo_tree("org/model", recursive=True, revision="main"))
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    folders = {e.path for e in entries if isinstance(e, RepoFolder)}
    assert set(files) == set(MODEL)
    assert folders == {"weights", "sub dir"}
    for path, data in MODEL.items():
        assert files[path].size == len(data), path
    for path in ("config.json", "tokenizer.json", "sub dir/notes \u00fc.txt"):
        assert files[path].lfs is None, path
        assert files[path].blob_id == git_blob_id(MODEL[path]), path
    for path in ("model.safetensors", "weights/blob.dat"):
        assert files[path].lfs.sha256 == hashlib.sha256(MODEL[path]).hexdigest(), path
        assert files[path].lfs.size == len(MODEL[path])
        assert files[path].blob_id == lfs_pointer_id(MODEL[path]), path
    pages = hub.find_requests(method="GET", path_contains="/api/models/org/model/tree/")
    assert len(pages) == math.ceil(len(entries) / 2) > 1
    assert all(page.status == 200 for page in pages)


def test_list_repo_tree_lists_direct_children_or_one_subfolder(hub):
    api = HfApi(endpoint=hub.endpoint, token=False)
    top = {e.path for e in api.list_repo_tree("org/model")}
    assert top == {"config.json", "tokenizer.json", "model.safetensors", "weights", "sub dir"}
    sub = list(api.list_repo_tree("org/model", path_in_repo="weights", recursive=True))
    assert [(e.path, e.size) for e in sub] == [("weights/blob.dat", len(BLOB))]
    data = {e.path for e in api.list_repo_tree("org/data", "data", repo_type="dataset")}
    assert data == {"data/train-00000.parquet", "data/test.jsonl"}


@pytest.mark.parametrize("path", ["no-such-folder", "config.json"])
def test_list_repo_tree_of_a_missing_folder_or_a_file_raises_entry_not_found(hub, path):
    api = HfApi(endpoint=hub.endpoint, token=False)
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree("org/model", path_in_repo=path))


def test_get_paths_info_returns_the_files_and_folders_that_exist(hub):
    api = HfApi(endpoint=hub.endpoint, token=False)
    found = api.get_paths_info("org/model", ["config.json", "weights", "missing.txt"])
    assert {(type(e).__name__, e.path) for e in found} == {
        ("RepoFile", "config.json"),
        ("RepoFolder", "weights"),
    }


# -- downloads ---------------------------------------------------------------------------------


def test_snapshot_download_fetches_byte_identical_model_files_into_cache_and_local_dir(
    hub, tmp_path
):
    cached = snapshot_download(
        "org/model", endpoint=hub.endpoint, token=TOKEN, cache_dir=tmp_path / "cache"
    )
    assert Path(cached).name == hub.sha("org/model")
    assert read_tree(Path(cached)) == MODEL
    local = tmp_path / "local"
    snapshot_download("org/model", endpoint=hub.endpoint, token=TOKEN, local_dir=local)
    assert read_tree(local) == MODEL
    assert hub.find_requests(server="cdn", method="GET"), "LFS bytes must come from the CDN"
    assert hub.leaked_auth == []


def test_snapshot_download_fetches_byte_identical_dataset_files(hub, tmp_path):
    local = tmp_path / "dataset"
    snapshot_download(
        "org/data", repo_type="dataset", endpoint=hub.endpoint, token=False, local_dir=local
    )
    assert read_tree(local) == DATASET


@pytest.mark.parametrize("revision", ["main", "v1-branch", "v1.0", "sha-of-v1"])
def test_hf_hub_download_follows_branches_tags_and_commit_shas(hub, tmp_path, revision):
    rev = hub.sha("org/model", "v1-branch") if revision == "sha-of-v1" else revision
    expected = MODEL if revision == "main" else MODEL_V1
    for name in ("config.json", "model.safetensors"):
        path = hf_hub_download(
            "org/model",
            name,
            revision=rev,
            endpoint=hub.endpoint,
            token=False,
            cache_dir=tmp_path / "cache",
        )
        assert Path(path).read_bytes() == expected[name]
        assert Path(path).parent.name == hub.sha("org/model", rev)


def test_hf_hub_download_handles_spaces_unicode_and_legacy_repo_ids(hub, tmp_path):
    name = "sub dir/notes \u00fc.txt"
    path = hf_hub_download(
        "org/model", name, endpoint=hub.endpoint, token=False, local_dir=tmp_path
    )
    assert Path(path).read_bytes() == MODEL[name]
    hub.add_repo("gpt2", {"config.json": b"{}"})
    assert HfApi(endpoint=hub.endpoint, token=False).repo_info("gpt2").sha == hub.sha("gpt2")
    path = hf_hub_download(
        "gpt2", "config.json", endpoint=hub.endpoint, token=False, local_dir=tmp_path
    )
    assert Path(path).read_bytes() == b"{}"


def test_a_new_commit_on_main_moves_the_branch_and_keeps_old_commits_readable(hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint, token=False)
    old = hub.sha("org/model")
    new = hub.commit(
        "org/model", {"config.json": b'{"model_type": "v3"}'}, delete=["tokenizer.json"]
    )
    assert api.repo_info("org/model").sha == new != old
    before, after = (file_ids(api, "org/model", rev) for rev in (old, "main"))
    assert set(before) - set(after) == {"tokenizer.json"}
    changed = {p for p in after if after[p] != before[p]}
    assert changed == {"config.json"}
    path = hf_hub_download(
        "org/model",
        "tokenizer.json",
        revision=old,
        endpoint=hub.endpoint,
        token=False,
        cache_dir=tmp_path,
    )
    assert Path(path).read_bytes() == MODEL["tokenizer.json"]


# -- raw HTTP: ranges and the CDN redirect ------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize(
    ("header", "first", "last"),  # last=None: the file's last byte
    [
        ("bytes=3-9", 3, 9),
        ("bytes=5-", 5, None),
        ("bytes=-4", -4, None),
        ("bytes=2-99999999", 2, None),
    ],
)
def test_range_requests_answer_206_with_exactly_the_requested_bytes(
    hub, http, name, header, first, last
):
    data = MODEL[name]
    first = first % len(data)
    last = len(data) - 1 if last is None else last
    response = http.request("GET", hub.url("org/model", name), headers={"Range": header})
    assert response.status == 206
    assert response.data == data[first : last + 1]
    assert response.headers["Content-Range"] == f"bytes {first}-{last}/{len(data)}"


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_an_unsatisfiable_range_answers_416_and_no_range_the_whole_file(hub, http, name):
    size = len(MODEL[name])
    response = http.request("GET", hub.url("org/model", name), headers={"Range": f"bytes={size}-"})
    assert response.status == 416
    assert response.headers["Content-Range"] == f"bytes */{size}"
    whole = http.request("GET", hub.url("org/model", name))
    assert (whole.status, whole.data) == (200, MODEL[name])
    assert whole.headers["Accept-Ranges"] == "bytes"


def test_resolve_of_a_regular_file_answers_with_its_git_blob_id_and_commit(hub, http):
    response = http.request("HEAD", hub.url("org/model", "config.json"))
    assert response.status == 200
    assert response.headers["ETag"] == f'"{git_blob_id(MODEL["config.json"])}"'
    assert response.headers["X-Repo-Commit"] == hub.sha("org/model")
    assert int(response.headers["Content-Length"]) == len(MODEL["config.json"])


def test_resolve_of_an_lfs_file_redirects_to_the_cdn_port_with_linked_etag_and_size(hub, http):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = hub.url("org/gated", "model.safetensors")
    response = http.request("HEAD", url, headers=auth, redirect=False)
    assert response.status == 302
    location = urlsplit(response.headers["Location"])
    assert location.port == urlsplit(hub.cdn_endpoint).port != urlsplit(hub.endpoint).port
    sha256 = hashlib.sha256(SECRET["model.safetensors"]).hexdigest()
    assert response.headers["X-Linked-Etag"] == f'"{sha256}"'
    assert response.headers["X-Linked-Size"] == str(len(SECRET["model.safetensors"]))
    assert response.headers["X-Repo-Commit"] == hub.sha("org/gated")
    followed = http.request("GET", url, headers={**auth, "Range": "bytes=0-5"})
    assert (followed.status, followed.data) == (206, SECRET["model.safetensors"][:6])
    assert hub.leaked_auth == []


def test_the_real_client_never_sends_authorization_to_the_cdn(hub, tmp_path):
    for repo in ("org/gated", "org/private"):
        path = hf_hub_download(
            repo, "model.safetensors", endpoint=hub.endpoint, token=TOKEN, cache_dir=tmp_path
        )
        assert Path(path).read_bytes() == SECRET["model.safetensors"]
    resolves = hub.find_requests(server="hub", path_contains="/resolve/")
    assert resolves and all(r.headers.get("authorization") == "Bearer ***" for r in resolves)
    assert len(hub.find_requests(server="cdn", method="GET")) == 2
    assert hub.leaked_auth == []


def test_leaked_auth_records_an_authorization_header_sent_to_the_cdn(hub, http):
    location = http.request("HEAD", hub.url("org/model", "model.safetensors"), redirect=False)
    cdn_url = location.headers["Location"]
    response = http.request("GET", cdn_url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 200
    assert [r.headers["authorization"] for r in hub.leaked_auth] == ["Bearer ***"]
    assert all(TOKEN not in str(r) for r in hub.requests), "the log must not hold secrets"


def test_a_tampered_cdn_url_is_refused(hub, http):
    location = http.request("HEAD", hub.url("org/model", "model.safetensors"), redirect=False)
    tampered = location.headers["Location"].replace("expires=", "expires=9")
    assert http.request("GET", tampered).status == 403


# -- auth and typed errors ---------------------------------------------------------------------


def test_a_private_repo_is_hidden_from_anonymous_users_and_tokens_without_access(hub, tmp_path):
    for token, status in ((False, 401), (OTHER, 404)):
        api = HfApi(endpoint=hub.endpoint, token=token)
        with pytest.raises(RepositoryNotFoundError) as info:
            api.repo_info("org/private")
        assert not isinstance(info.value, GatedRepoError)
        assert info.value.response.status_code == status
        with pytest.raises(RepositoryNotFoundError):
            hf_hub_download(
                "org/private", "config.json", endpoint=hub.endpoint, token=token, cache_dir=tmp_path
            )
        with pytest.raises(RepositoryNotFoundError):
            snapshot_download("org/private", endpoint=hub.endpoint, token=token, cache_dir=tmp_path)
    path = snapshot_download("org/private", endpoint=hub.endpoint, token=TOKEN, cache_dir=tmp_path)
    assert read_tree(Path(path)) == SECRET


def test_a_gated_repo_shows_metadata_but_needs_accepted_conditions_to_download(hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint, token=False)
    assert api.repo_info("org/gated").gated == "manual"
    assert {e.path for e in api.list_repo_tree("org/gated")} == set(SECRET)
    for token, status in ((False, 401), (OTHER, 403)):
        with pytest.raises(GatedRepoError) as info:
            hf_hub_download(
                "org/gated", "config.json", endpoint=hub.endpoint, token=token, cache_dir=tmp_path
            )
        assert info.value.response.status_code == status
    assert "accept the conditions" in info.value.response.headers["X-Error-Message"]
    path = hf_hub_download(
        "org/gated", "config.json", endpoint=hub.endpoint, token=TOKEN, cache_dir=tmp_path
    )
    assert Path(path).read_bytes() == SECRET["config.json"]


def test_an_unknown_token_is_refused_even_on_a_public_repo_like_the_hub_does(hub):
    api = HfApi(endpoint=hub.endpoint, token="hf_not_a_real_token")
    with pytest.raises(HfHubHTTPError) as info:
        api.repo_info("org/model")
    assert not isinstance(info.value, RepositoryNotFoundError)
    assert info.value.response.status_code == 401
    assert "Invalid credentials in Authorization header" in str(info.value)
    hub.reject_invalid_tokens = False
    assert api.repo_info("org/model").sha == hub.sha("org/model")


@pytest.mark.parametrize(("repo", "repo_type"), [("org/nope", "model"), ("org/model", "dataset")])
def test_an_unknown_repo_raises_repository_not_found(hub, tmp_path, repo, repo_type):
    api = HfApi(endpoint=hub.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError) as info:
        api.repo_info(repo, repo_type=repo_type)
    assert not isinstance(info.value, GatedRepoError)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(
            repo,
            "config.json",
            repo_type=repo_type,
            endpoint=hub.endpoint,
            token=False,
            cache_dir=tmp_path,
        )


def test_an_unknown_revision_raises_revision_not_found(hub, tmp_path):
    api = HfApi(endpoint=hub.endpoint, token=False)
    with pytest.raises(RevisionNotFoundError):
        api.repo_info("org/model", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        list(api.list_repo_tree("org/model", revision="no-such-branch"))
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(
            "org/model",
            "config.json",
            revision="no-such-branch",
            endpoint=hub.endpoint,
            token=False,
            cache_dir=tmp_path,
        )
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(
            "org/model",
            revision="no-such-branch",
            endpoint=hub.endpoint,
            token=False,
            cache_dir=tmp_path,
        )


def test_a_missing_file_raises_entry_not_found_and_names_the_commit(hub, tmp_path, http):
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(
            "org/model", "missing.txt", endpoint=hub.endpoint, token=False, cache_dir=tmp_path
        )
    response = http.request("GET", hub.url("org/model", "missing.txt"))
    assert (response.status, response.headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert response.headers["X-Repo-Commit"] == hub.sha("org/model")


# -- fault injection, streaming, quietness -----------------------------------------------------


def test_connections_are_kept_alive_across_requests(hub):
    http = urllib3.PoolManager(maxsize=1)
    for _ in range(5):
        assert http.request("GET", hub.url("org/model", "config.json")).status == 200
    assert {r.connection for r in hub.find_requests(server="hub")} == {1}


def test_fault_error_answers_the_status_then_later_requests_succeed(hub, http):
    hub.fault = fail_times(1, Fault.error(503, retry_after=2), path_contains="config.json")
    first = http.request("GET", hub.url("org/model", "config.json"))
    assert (first.status, first.headers["Retry-After"]) == (503, "2")
    second = http.request("GET", hub.url("org/model", "config.json"))
    assert (second.status, second.data) == (200, MODEL["config.json"])


def test_fault_drop_closes_the_connection_without_an_answer(hub, http):
    hub.fault = fail_times(1, Fault.drop())
    with pytest.raises(urllib3.exceptions.ProtocolError):
        http.request("GET", hub.url("org/model", "config.json"), retries=False)
    assert hub.requests[-1].status == 0


def test_fault_truncate_sends_a_short_body_under_the_full_content_length(hub, http):
    hub.fault = fail_times(1, Fault.truncate(after_bytes=5))
    response = http.request(
        "GET", hub.url("org/model", "config.json"), retries=False, preload_content=False
    )
    assert int(response.headers["Content-Length"]) == len(MODEL["config.json"])
    with pytest.raises(urllib3.exceptions.ProtocolError):
        response.read()


def test_fault_delay_holds_the_answer_back(hub, http):
    hub.fault = fail_times(1, Fault.delay(0.3))
    started = time.monotonic()
    response = http.request("GET", hub.url("org/model", "config.json"))
    assert time.monotonic() - started >= 0.3
    assert response.data == MODEL["config.json"]


def test_the_real_client_resumes_a_truncated_cdn_body_with_a_range_request(hub, tmp_path):
    # huggingface_hub writes 10 MiB chunks: only a cut after 10 MiB leaves something to resume.
    weights = _rng.randbytes(12 * MiB)
    hub.commit("org/model", {"large.safetensors": weights})
    hub.fault = fail_times(1, Fault.truncate(after_bytes=10 * MiB + 5), server="cdn", method="GET")
    path = hf_hub_download(
        "org/model", "large.safetensors", endpoint=hub.endpoint, token=False, cache_dir=tmp_path
    )
    assert Path(path).read_bytes() == weights
    cdn_gets = hub.find_requests(server="cdn", method="GET")
    assert [r.range for r in cdn_gets] == [None, f"bytes={10 * MiB}-"]
    assert [r.status for r in cdn_gets] == [200, 206]


def test_big_files_stream_from_disk_without_being_read_into_memory(hub, tmp_path, http):
    big = tmp_path / "big.safetensors"
    with big.open("wb") as f:
        for _ in range(64):
            f.write(os.urandom(MiB))
    hub.commit("org/model", {"big.safetensors": big})
    digest = hashlib.sha256()
    tracemalloc.start()
    try:
        response = http.request(
            "GET", hub.url("org/model", "big.safetensors"), preload_content=False
        )
        for chunk in response.stream(MiB):
            digest.update(chunk)
        response.release_conn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert digest.hexdigest() == hashlib.sha256(big.read_bytes()).hexdigest()
    assert peak < 16 * MiB, f"peak Python memory {peak / MiB:.1f} MiB for a 64 MiB file"


def test_the_server_writes_nothing_to_stderr_even_when_clients_misbehave(capfd):
    with HubServer() as hub:
        hub.add_repo("org/quiet", {"config.json": b"{}", "model.bin": b"w" * (8 * MiB)})
        http = urllib3.PoolManager(retries=False)
        assert http.request("GET", hub.url("org/quiet", "config.json")).status == 200
        assert http.request("GET", f"{hub.endpoint}/no/such/route/at/all").status == 404
        hub.fault = fail_times(1, Fault.drop())
        with pytest.raises(urllib3.exceptions.ProtocolError):
            http.request("GET", hub.url("org/quiet", "config.json"))
        cdn = http.request("HEAD", hub.url("org/quiet", "model.bin"), redirect=False)
        target = urlsplit(cdn.headers["Location"])
        with socket.create_connection((target.hostname, target.port)) as sock:
            request = f"GET {target.path}?{target.query} HTTP/1.1\r\nHost: x\r\n\r\n"
            sock.sendall(request.encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 200")  # then hang up mid-body
        time.sleep(0.2)  # let the handler hit the broken pipe
    assert capfd.readouterr().err == ""
    assert hub.errors == []
