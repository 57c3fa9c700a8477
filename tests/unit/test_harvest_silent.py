"""A harvest against an endpoint that accepts connections and answers nothing ends within its
budget with a clear error (issue 27 item 5), on a real TCP server that never writes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from inferasim.harvest import HarvestConfig, HarvestError, harvest, parse_plan


class _Server:
    """A real TCP server: `lists` answers GET /v1/models, then stays silent on every request."""

    def __init__(self, lists: bool) -> None:
        self.lists = lists
        self.loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.sock = sock
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if self.lists and head.startswith(b"GET /v1/models"):
                body = json.dumps({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                continue
            await asyncio.sleep(3600)  # silent: read, never answer

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, sock=self.sock))
        self.loop.run_until_complete(server.serve_forever())


@pytest.fixture
def silent() -> Iterator[_Server]:
    yield _Server(lists=False)


@pytest.fixture
def mute_engine() -> Iterator[_Server]:
    yield _Server(lists=True)


def _cfg(port: int, budget: float) -> HarvestConfig:
    return HarvestConfig(endpoint=f"http://127.0.0.1:{port}", model="meta-llama/Llama-3.1-8B", gpu="h100_sxm",
                         engine="vllm", served_model_name="m", plan=parse_plan("128x16@1"), budget_s=budget)


def test_a_silent_endpoint_fails_within_the_budget(silent: _Server) -> None:
    t0 = time.perf_counter()
    with pytest.raises(HarvestError, match="sent no answer to GET /v1/models within 3 s"):
        harvest(_cfg(silent.port, 3.0))
    assert time.perf_counter() - t0 < 10


def test_an_endpoint_that_lists_but_never_generates_fails_within_the_budget(mute_engine: _Server) -> None:
    t0 = time.perf_counter()
    with pytest.raises(HarvestError, match="answered no 4-token warm-up request within"):
        harvest(_cfg(mute_engine.port, 4.0))
    assert time.perf_counter() - t0 < 15
