"""The byte stream a transport opens and a source hands to the engine: one ranged response.

It lives below both: transports implement it, sources return it, and neither imports the other's
layer to name it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager


class RangeReader(AbstractContextManager["RangeReader"]):
    """An open response for bytes ``[start, end)`` of one file."""

    headers: Mapping[str, str]  # looked up case-insensitively

    @abstractmethod
    def chunks(self) -> Iterator[memoryview]:
        """Yield the body in chunks, each valid only until the next is asked for; raise
        TransientError on a retryable failure."""

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None: ...
