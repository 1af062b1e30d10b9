"""Reading a ListObjectsV2 page: as botocore's dicts for the plan, as bare rows for the check.

The plan (:meth:`~initializers.sources.s3rest.RestPlane.list_objects`) reads every page with
ElementTree into botocore's keys, checksum fields included. The warm rerun's check
(:mod:`initializers.unchanged`) needs each key, size and ETag of a million keys in a few
seconds: ElementTree builds ~6 elements a key and reading them back into dicts cost ~5 µs a
key here, more than the rest of the check. :func:`key_page` reads the three with one regular
expression instead (~1.3 µs a key), where the page is in the plain shape AWS, moto, SeaweedFS
and rclone send (the S3 compatibility matrix checks each); any other page (a namespace prefix,
CDATA, a comment, a reference other than a quote's, another encoding, an entry laid out
otherwise) is read by ElementTree, so the rows are the same either way.

Why no entry can be missed or misread: a match starts at ``<Contents>`` and runs through
elements that must follow one another, so it never leaves its entry, and a page's rows are kept
only when there are exactly as many matches as ``<Contents`` in it.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote_plus

KeyRow = tuple[str, int, str | None]  # (key past the folder, size, ETag unquoted or None)

_ENTRY = re.compile(  # an entry laid out as AWS, moto, SeaweedFS and rclone lay it out
    r"<Contents>\s*<Key>([^<]*)</Key>\s*(?:<LastModified>[^<]*</LastModified>\s*)?"
    r"<ETag>([^<]*)</ETag>\s*(?:<(Checksum\w*)>[^<]*</\3>\s*)*<Size>([0-9]+)</Size>"
)
_TRUNCATED = re.compile(r"<IsTruncated>true</IsTruncated>")
_TOKEN = re.compile(r"<NextContinuationToken>([^<]*)</NextContinuationToken>")
_URL_ENCODED = re.compile(r"<EncodingType>url</EncodingType>")
_DECLARED = re.compile(r"<\?xml[^>]*?encoding=[\"']([^\"']*)")
_OTHER_REFERENCE = re.compile(r"&(?!quot;|#34;)")  # any but a quote's (an ETag's, quoted)


class Page(NamedTuple):
    """One page's entries, and how to ask for the next one."""

    entries: list[Any]
    truncated: bool
    token: str | None


def tree_page(body: bytes) -> Page:
    """The page as botocore's ListObjectsV2 ``Contents`` dicts; ET.ParseError if not XML."""
    root = ET.fromstring(body)
    ns = namespace_of(root)
    encoded_keys = root.findtext(f"{ns}EncodingType") == "url"  # else the server ignored it
    return Page(
        [_object(item, encoded_keys, ns) for item in root.iter(f"{ns}Contents")],
        root.findtext(f"{ns}IsTruncated", "false") == "true",
        root.findtext(f"{ns}NextContinuationToken"),
    )


def key_page(folder: str, body: bytes) -> Page:
    """The page as :data:`KeyRow` rows of the keys under ``folder``: by :data:`_ENTRY` where
    the page is plain, else from :func:`tree_page`."""
    plain = _plain_page(folder, body)
    if plain is not None:
        return plain
    page = tree_page(body)
    return page._replace(entries=rows_of(page.entries, folder))


def rows_of(objects: Iterable[dict[str, Any]], folder: str) -> list[KeyRow]:
    """:data:`KeyRow` rows of botocore's ``Contents`` dicts."""
    start = len(folder)
    return [(o["Key"][start:], int(o.get("Size", 0)), version_of(o)) for o in objects]


def version_of(obj: Mapping[str, Any]) -> str | None:
    """An object's version as the manifest records it: its ETag, unquoted."""
    return str(obj.get("ETag", "")).strip('"') or None


def namespace_of(root: ET.Element) -> str:
    """The ``{namespace}`` the root's name is in ("" without one): S3 declares its namespace
    once, on the root, and every name inherits it. Naming them in it is cheaper than renaming
    every element (~10 renames a key, 1,000 keys a page)."""
    return root.tag[: root.tag.index("}") + 1] if "}" in root.tag else ""


def _plain_page(folder: str, body: bytes) -> Page | None:
    """A page in the plain shape as :data:`KeyRow` rows, or None for any other page."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    declared = _DECLARED.match(text)
    if (
        "<ListBucketResult" not in text
        or "<!" in text
        or (declared is not None and declared.group(1).lower() not in ("utf-8", "utf8"))
        or ":Contents" in text  # a prefixed name: no pattern here would see the entry
        or _OTHER_REFERENCE.search(text)
    ):
        return None
    found = _ENTRY.findall(text)
    if len(found) != text.count("<Contents"):
        return None
    quote = "&#34;" if "&#34;" in text else "&quot;"  # Go's XML encoder spells it &#34;
    if quote != "&quot;" and "&quot;" in text:
        return None
    decode, start = _URL_ENCODED.search(text) is not None, len(folder)
    rows = [
        (
            (
                _key(key, quote, decode)
                if "&" in key or (decode and ("%" in key or "+" in key))
                else key
            )[start:],
            int(size),
            etag.replace(quote, '"').strip('"') or None,
        )
        for key, etag, _, size in found
    ]
    token = _TOKEN.search(text)
    return Page(
        rows, _TRUNCATED.search(text) is not None, token and token.group(1).replace(quote, '"')
    )


def _key(text: str, quote: str, decode: bool) -> str:
    """A key's text with its quotes' references replaced (the only ones a plain page has), then
    URL-decoded where the server encoded it."""
    key = text.replace(quote, '"')
    return unquote_plus(key) if decode and ("%" in key or "+" in key) else key


def _object(item: ET.Element, encoded_key: bool, ns: str) -> dict[str, Any]:
    """One ``<Contents>`` of a listing, in botocore's keys (the key URL-decoded when the server
    encoded it, as botocore does for ``encoding-type=url``); ``ns``: the page's namespace. A
    listing's every key passes here: the checksum's elements are looked for only once one is
    known to be there, and a key is decoded only when it has something to decode."""
    key = item.findtext(f"{ns}Key", "")
    if encoded_key and ("%" in key or "+" in key):
        key = unquote_plus(key)
    found: dict[str, Any] = {
        "Key": key,
        "Size": int(item.findtext(f"{ns}Size", "0")),
        "ETag": item.findtext(f"{ns}ETag", ""),
    }
    if item.find(f"{ns}ChecksumAlgorithm") is not None:
        algorithms = [a.text for a in item.iter(f"{ns}ChecksumAlgorithm") if a.text]
        if algorithms:
            found["ChecksumAlgorithm"] = algorithms
    kind = item.findtext(f"{ns}ChecksumType")
    if kind:
        found["ChecksumType"] = kind
    return found
