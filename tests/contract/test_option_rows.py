"""Options are declared once, by their owner; what is derived from the rows follows them."""

from __future__ import annotations

import pytest

from initializers import dataset
from initializers.config import COMMON, all_groups, build_parser, load_settings
from initializers.sources import REGISTRY
from scripts.docs import WRITE, stale

SECRETS = {
    "STORAGE_URI": "file:///tmp",
    "SECRET_ACCESS_KEY": "s3-secret",
    "ACCESS_KEY_ID": "id",
    "HF_TOKEN": "hf-secret",
    "AZURE_STORAGE_ACCOUNT_KEY": "az-secret",
    "HTTP_HEADERS": '{"Authorization": "Bearer web-secret"}',
}


def test_the_generated_docs_are_what_the_rows_say():
    assert stale() == [], f"run {WRITE}"


def test_every_option_is_declared_once():
    dests = [o.dest for group in all_groups() for o in group.rows]
    assert len(dests) == len(set(dests))
    names = [name for group in all_groups() for o in group.rows for name in o.env]
    assert len(names) == len(set(names))


def test_help_shows_every_default_a_row_declares():
    text = " ".join(build_parser(dataset.DEFAULTS).format_help().split())
    for option in (o for group in all_groups() for o in group.rows):
        if option.flag and option.default_text():
            assert f"{option.flag.upper().lstrip('-').replace('-', '_')}" in text
            assert f"(default: {option.default_text()})" in text, option.dest


def test_every_secret_is_in_the_secret_list_and_never_in_the_repr():
    settings = load_settings(dataset.DEFAULTS, [], SECRETS)
    found = set(settings.secrets())
    assert {"s3-secret", "hf-secret", "az-secret", "Bearer web-secret"} <= found
    assert not any(secret in repr(settings) for secret in found)


@pytest.mark.parametrize(("scheme", "uri"), [("s3", "s3://b/p"), ("hf", "hf://org/m")])
def test_a_source_sees_the_common_options_and_its_own_only(scheme, uri):
    settings = load_settings(dataset.DEFAULTS, [], {**SECRETS, "STORAGE_URI": uri})
    own = REGISTRY[scheme].option_group()
    given = settings.for_source(own, settings.retry_policy())
    mine = {o.dest for o in COMMON.rows} | {o.dest for o in own.rows}
    assert set(given) >= mine & set(settings)  # a secret file's row is read into its secret
    others = {o.dest for g in all_groups() if g not in (COMMON, own) for o in g.rows}
    assert others and not others & set(given)
    assert "az-secret" not in given.secrets() and "Bearer web-secret" not in given.secrets()
    with pytest.raises(AttributeError, match="not among these options"):
        _ = given.azure_key
