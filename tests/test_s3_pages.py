"""The warm rerun's quick reading of ListObjectsV2 pages: the plan's rows, or ElementTree's.

:func:`initializers.sources.s3pages.key_page` reads a page in the plain shape with a regular
expression; every other page goes to ElementTree. Each page here is read both ways and by the
plan's reader (:func:`~initializers.sources.s3pages.tree_page`): the rows must agree, and the
reader must be the one the page's shape calls for. The servers' own pages are read the same way
in the S3 compatibility matrix (``tests/compat``).
"""

from __future__ import annotations

import pytest

from initializers.sources import s3pages

NS = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
HEAD = '<?xml version="1.0" encoding="UTF-8"?>'


def page(*entries: str, more: bool = False, encoded: bool = True, root: str = NS) -> bytes:
    """A ListObjectsV2 page of ``entries`` (``<Contents>`` elements)."""
    tail = "<NextContinuationToken>t+/=1</NextContinuationToken>" if more else ""
    kind = "<EncodingType>url</EncodingType>" if encoded else ""
    return (
        f"{HEAD}<ListBucketResult{root}><Name>b</Name><Prefix>d/</Prefix>{kind}"
        f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>{tail}"
        + "".join(entries)
        + "</ListBucketResult>"
    ).encode()


def aws(key: str, size: int, etag: str = "&quot;e1&quot;", extra: str = "") -> str:
    """An entry laid out as AWS lays it out (checksum elements between ETag and Size)."""
    return (
        f"<Contents><Key>{key}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
        f"<ETag>{etag}</ETag>{extra}<Size>{size}</Size><StorageClass>STANDARD</StorageClass>"
        "</Contents>"
    )


def go(key: str, size: int) -> str:
    """An entry as SeaweedFS's Go encoder writes it: quotes as ``&#34;``, LastModified last."""
    return (
        f"<Contents><Key>{key}</Key><ETag>&#34;e2&#34;</ETag><Size>{size}</Size>"
        "<StorageClass>STANDARD</StorageClass><LastModified>2026-01-01T00:00:00Z</LastModified>"
        "</Contents>"
    )


PLAIN = {
    "aws": page(aws("d/a.bin", 1), aws("d/b%2Bc%20d.bin", 2), aws("d/%C3%BC+1.bin", 3)),
    "aws, checksums listed": page(
        aws("d/a", 1, extra="<ChecksumAlgorithm>CRC32</ChecksumAlgorithm>"),
        aws(
            "d/b",
            2,
            extra="<ChecksumAlgorithm>CRC64NVME</ChecksumAlgorithm>"
            "<ChecksumType>FULL_OBJECT</ChecksumType>",
        ),
    ),
    "go": page(go("d/a", 1), go("d/b%26c", 2), more=True),
    "go, keys not url-encoded": page(go("d/a&#34;b", 1), go("d/c", 2), encoded=False),
    "no namespace": page(aws("d/a", 1), root=""),
    "unquoted etag": page(aws("d/a", 1, etag="e3"), aws("d/b", 0, etag="")),
    "no entries": page(more=False),
    "truncated": page(aws("d/a", 1), more=True),
    "keys not url-encoded": page(aws("d/a+b%20.bin", 1), encoded=False),
    "pretty-printed": page(aws("d/a", 1).replace("><", ">\n  <"), aws("d/b", 2)),
}

ELEMENT_TREE = {
    "a reference in a key": page(aws("d/a&amp;b", 1), encoded=False),
    "numeric references": page(aws("d/&#252;", 1, etag="&#x22;e4&#x22;"), encoded=False),
    "quotes spelled both ways": page(aws("d/a", 1), go("d/b", 2)),
    "CDATA": page(aws("<![CDATA[d/a]]>", 1)),
    "a comment": page(aws("d/a", 1) + "<!-- x -->"),
    "prefixed names": page(aws("d/a", 1))
    .replace(b"Contents>", b"s3:Contents>")
    .replace(
        f"<ListBucketResult{NS}>".encode(), f"<ListBucketResult{NS} xmlns:s3{NS[6:]}>".encode()
    ),
    "size before the etag": page(
        aws("d/a", 1),
        "<Contents><Key>d/b</Key><Size>2</Size><ETag>&quot;e5&quot;</ETag></Contents>",
        aws("d/c", 3),
    ),
    "no etag in one entry": page(
        aws("d/a", 1), "<Contents><Key>d/b</Key><Size>2</Size></Contents>"
    ),
    "an entry with an attribute": page(
        aws("d/a", 1), aws("d/b", 2).replace("<Contents>", '<Contents i="1">')
    ),
    "another encoding": page(aws("d/a", 1)).replace(b"UTF-8", b"ISO-8859-1"),
}


def tree_rows(body: bytes) -> tuple[list[s3pages.KeyRow], bool, str | None]:
    found = s3pages.tree_page(body)
    return s3pages.rows_of(found.entries, "d/"), found.truncated, found.token


def pages_handed_to_element_tree(monkeypatch) -> list[bytes]:
    """From here to the test's end: the pages the warm check's reader could not read by its
    pattern and handed to ElementTree (none: the pattern read every page)."""
    fallbacks: list[bytes] = []
    read_by_tree = s3pages.tree_page
    monkeypatch.setattr(
        s3pages, "tree_page", lambda body: fallbacks.append(body) or read_by_tree(body)
    )
    return fallbacks


def reader(fallbacks: list[bytes]) -> str:
    return "ElementTree" if fallbacks else "pattern"


def quick_rows(
    body: bytes, monkeypatch
) -> tuple[tuple[list[s3pages.KeyRow], bool, str | None], str]:
    """The page as the warm check reads it, and the reader that read it."""
    fallbacks = pages_handed_to_element_tree(monkeypatch)
    found = s3pages.key_page("d/", body)
    monkeypatch.undo()
    return (found.entries, found.truncated, found.token), reader(fallbacks)


@pytest.mark.parametrize("shape", PLAIN)
def test_a_plain_page_is_read_by_the_pattern_into_the_plans_rows(shape, monkeypatch):
    found, reader = quick_rows(PLAIN[shape], monkeypatch)
    assert found == tree_rows(PLAIN[shape])
    assert reader == "pattern"


@pytest.mark.parametrize("shape", ELEMENT_TREE)
def test_any_other_page_is_read_by_element_tree_and_no_entry_is_lost(shape, monkeypatch):
    found, reader = quick_rows(ELEMENT_TREE[shape], monkeypatch)
    assert found == tree_rows(ELEMENT_TREE[shape])
    assert reader == "ElementTree"
    assert len(found[0]) == ELEMENT_TREE[shape].count(b"</Contents>") + ELEMENT_TREE[shape].count(
        b"</s3:Contents>"
    )


def test_rows_are_keys_past_the_folder_with_sizes_and_unquoted_etags(monkeypatch):
    (rows, truncated, token), _ = quick_rows(PLAIN["aws"], monkeypatch)
    assert rows == [("a.bin", 1, "e1"), ("b+c d.bin", 2, "e1"), ("ü 1.bin", 3, "e1")]
    assert (truncated, token) == (False, None)
    (rows, truncated, token), _ = quick_rows(PLAIN["go"], monkeypatch)
    assert rows == [("a", 1, "e2"), ("b&c", 2, "e2")]
    assert (truncated, token) == (True, "t+/=1")
    assert quick_rows(PLAIN["unquoted etag"], monkeypatch)[0][0] == [("a", 1, "e3"), ("b", 0, None)]


def test_a_page_that_is_not_xml_fails_as_the_plans_reading_does():
    with pytest.raises(s3pages.ET.ParseError):
        s3pages.key_page("d/", b"<ListBucketResult><Contents>")
    with pytest.raises(s3pages.ET.ParseError):
        s3pages.key_page("d/", b"")
