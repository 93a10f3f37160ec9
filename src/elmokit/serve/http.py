"""The HTTP protocols `elmokit serve` runs on: uvicorn's httptools (or h11) protocol with bounds on
what it reads before the app sees a request.

uvicorn sets no limit on a request's line and headers with httptools (the parser buffers a header
of any size, before the app and its API key check run) and no time limit for them with either
parser. ``BoundedHttpTools`` and ``BoundedH11`` count the bytes of each request's head as they
arrive and answer 431 past ``max_bytes``, 431 past ``max_count`` header lines (httptools; under h11
the app's guard counts them), and 408 when a head is not complete ``timeout`` seconds after its
first byte (or after the connection opened, for a connection that sends nothing: closed).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
from dataclasses import dataclass
from typing import Any

from .limits import error_body

__all__: list[str] = []

log = logging.getLogger(__name__)

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class HeadLimits:
    """What a request's head (its request line and headers) may be: bytes, header lines, seconds."""

    max_bytes: int
    max_count: int
    timeout: float


def refusal(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response carrying the JSON error of every refusal, closing the connection."""
    body = json.dumps(error_body(status, message)).encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n" % (status, _REASONS.get(status, b""), len(body))
    ) + body


class _HeadGuard(asyncio.Protocol):
    """What both protocols share: the byte count and the clock of the request head being read,
    in front of uvicorn's protocol (the next class of a subclass's bases), which parses the
    bytes that pass. A subclass says when a head is being read (``_in_head``)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def _guard(self, head: HeadLimits) -> None:
        self.head = head
        self.head_bytes = 0  # of the head being read
        self.head_count = 0
        self.clock: asyncio.TimerHandle | None = None
        self.refused = False

    def _in_head(self) -> bool:
        raise NotImplementedError

    def _feed(self, data: bytes) -> None:
        """Hand ``data`` to uvicorn's protocol, which parses it."""
        super().data_received(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.clock = self.loop.call_later(self.head.timeout, self._too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._received(data)

    def _received(self, data: bytes) -> None:
        """Feed ``data`` to the parser, at most ``max_bytes`` of a head: past them, a 431."""
        if self.refused:
            return
        if self._in_head():
            if self.clock is None:
                self.clock = self.loop.call_later(self.head.timeout, self._too_slow)
            room = self.head.max_bytes - self.head_bytes
            if len(data) > room:  # the head must end within room bytes; the rest is its body
                self.head_bytes = self.head.max_bytes
                self._feed(data[:room])
                if self.refused or self.transport.is_closing():
                    return
                if self._in_head():
                    self._refuse(
                        431,
                        f"the request line and headers are larger than {self.head.max_bytes:,} bytes, "
                        "the most this server reads",
                    )
                    return
                data = data[room:]
            else:
                self.head_bytes += len(data)
        self._feed(data)
        if not self._in_head():
            self._head_read()

    def _head_read(self) -> None:
        if self.clock is not None:
            self.clock.cancel()
            self.clock = None
        self.head_bytes = self.head_count = 0

    def _too_slow(self) -> None:
        self.clock = None
        if self.transport.is_closing():
            return
        if self.head_bytes == 0:  # a connection that sent nothing
            self.transport.close()
            return
        self._refuse(408, f"the request's headers did not arrive within {self.head.timeout:g} s")

    def _refuse(self, status: int, message: str) -> None:
        self.refused = True
        if self.clock is not None:
            self.clock.cancel()
            self.clock = None
        peer = self.transport.get_extra_info("peername")
        log.debug("refused a request from %s: %d %s", peer, status, message)
        self.transport.write(refusal(status, message))
        self.transport.close()

    def _lost(self) -> None:
        if self.clock is not None:
            self.clock.cancel()
            self.clock = None


def _httptools_protocol() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpTools(_HeadGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol within ``HeadLimits``."""

        def __init__(self, *args: Any, head: HeadLimits, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._guard(head)
            self.reading_head = True

        def _in_head(self) -> bool:
            return self.reading_head

        # the parser's callbacks: nothing more of a refused request reaches uvicorn or the app
        def on_url(self, url: bytes) -> None:
            if not self.refused:
                super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            if self.refused:
                return
            self.head_count += 1
            if self.head_count > self.head.max_count:
                self._refuse(431, f"the request has more than {self.head.max_count} headers")
                return
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self.refused:
                return
            self.reading_head = False
            self._head_read()  # the clock stops before the app runs, however long it takes
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self.refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self.refused:
                return
            super().on_message_complete()
            self.reading_head = True  # what comes next is the next request's head

    BoundedHttpTools.__qualname__ = "BoundedHttpTools"  # pickled by name (see below)
    return BoundedHttpTools


def _h11_protocol() -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(_HeadGuard, H11Protocol):
        """uvicorn's h11 protocol within ``HeadLimits`` (h11 also stops at its
        ``h11_max_incomplete_event_size``, set to ``max_bytes``; the app's guard counts headers)."""

        def __init__(self, *args: Any, head: HeadLimits, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._guard(head)

        def _in_head(self) -> bool:
            return self.conn.their_state is h11.IDLE

    BoundedH11.__qualname__ = "BoundedH11"
    return BoundedH11


# module-level, so that uvicorn's --workers processes can unpickle the partial that names them
BoundedHttpTools: type | None = (
    _httptools_protocol() if importlib.util.find_spec("httptools") is not None else None
)
BoundedH11: type = _h11_protocol()


def protocol(http: str, head: HeadLimits) -> functools.partial:
    """What uvicorn's ``http=`` gets: the bounded protocol of ``http`` ("auto": httptools where it
    is installed, else h11; "httptools"; "h11") with ``head`` bound."""
    if http not in ("auto", "httptools", "h11"):
        raise ValueError(f"the HTTP parser must be auto, httptools or h11, got {http!r}")
    if http == "httptools" and BoundedHttpTools is None:
        raise ValueError("httptools is not installed: pip install 'elmokit[serve]'")
    cls = BoundedH11 if http == "h11" or BoundedHttpTools is None else BoundedHttpTools
    return functools.partial(cls, head=head)
