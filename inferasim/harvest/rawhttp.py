"""A minimal HTTP/1.1 client for streamed completions (standard library asyncio only).

Why not httpx for the measured requests: a benchmark client must not be the bottleneck it
measures. httpx + httpcore + h11 + anyio cost one to several milliseconds of CPU per streamed
request on a small machine; against a fast endpoint (an emulator at 20x, or a real engine with
64 clients) the client then falls behind and its TTFT grows with its own queue. This client does
one `write` per request and parses the response with a few bytes operations: ~0.2 ms per request.
It keeps one connection per closed-loop client (keep-alive, as `vllm bench serve`'s aiohttp
session does) and reconnects when the server closes it.

It speaks what OpenAI-compatible servers send: a status line, headers, and a body framed by
Content-Length, chunked transfer encoding, or the connection's end. No TLS session reuse tricks,
no proxies, no redirects: the harvester falls back to httpx for https endpoints.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from inferasim.errors import InferasimError

MAX_HEAD = 64 * 1024


class RawHTTPError(InferasimError, ConnectionError):
    pass


class RawConnection:
    """One keep-alive connection to `base` (http://host:port)."""

    def __init__(self, base: str, timeout: float) -> None:
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {base!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.host_header = parts.netloc
        self.timeout = timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """Open the connection now (a benchmark opens its connections before the clock starts)."""
        if self.writer is None:
            await self._connect()

    async def _connect(self) -> None:
        ctx = ssl.create_default_context() if self.tls else None
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, ssl=ctx, limit=MAX_HEAD), self.timeout)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post_stream(self, path: str, payload: dict[str, object]) -> AsyncIterator[bytes]:
        """POST JSON and yield the response body as it arrives. Raises RawHTTPError (with the
        body) for a status other than 200."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nhost: {self.host_header}\r\ncontent-type: application/json\r\n"
                f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n").encode()
        for attempt in (0, 1):
            if self.writer is None:
                await self._connect()
            assert self.reader is not None and self.writer is not None
            try:
                self.writer.write(head + body)
                status_line = await asyncio.wait_for(self.reader.readuntil(b"\r\n"), self.timeout)
                break
            except (ConnectionError, asyncio.IncompleteReadError):
                # A kept-alive connection the server closed meanwhile: retry once on a new one.
                self.close()
                if attempt:
                    raise RawHTTPError(f"connection to {self.host}:{self.port} closed") from None
        reader = self.reader
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            self.close()
            raise RawHTTPError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        raw_headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
        headers: dict[bytes, bytes] = {}
        for line in raw_headers.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        keep = headers.get(b"connection", b"").lower() != b"close" and not parts[0].endswith(b"1.0")
        if status != 200:
            data = b"".join([c async for c in self._body(headers)])
            if not keep:
                self.close()
            raise RawHTTPError(f"HTTP {status}: {data[:500].decode(errors='replace')}")
        async for chunk in self._body(headers):
            yield chunk
        if not keep or b"content-length" not in headers and b"chunked" not in headers.get(b"transfer-encoding", b""):
            self.close()

    async def _body(self, headers: dict[bytes, bytes]) -> AsyncIterator[bytes]:
        reader = self.reader
        assert reader is not None
        timeout = self.timeout
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            while True:
                line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # Trailers (none expected) end with an empty line.
                    while (await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)) != b"\r\n":
                        pass
                    return
                data = await asyncio.wait_for(reader.readexactly(size + 2), timeout)
                yield data[:-2]
        elif b"content-length" in headers:
            left = int(headers[b"content-length"])
            while left > 0:
                data = await asyncio.wait_for(reader.read(min(left, 1 << 16)), timeout)
                if not data:
                    raise RawHTTPError("connection closed inside the response body")
                left -= len(data)
                yield data
        else:
            while True:
                data = await asyncio.wait_for(reader.read(1 << 16), timeout)
                if not data:
                    return
                yield data
