"""Where the emulated engine's tokens go: :class:`StreamSink` writes them as OpenAI SSE events
straight into a streamed request's connection, :class:`CollectSink` resolves a non-streamed
request at its finish. Generated tokens are words of a small fixed vocabulary (:data:`VOCAB`),
each with a leading space, so the text of N generated tokens is again N tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Protocol

from inferasim.emulator.api import ApiError
from inferasim.emulator.engine import EngineLoop
from inferasim.emulator.request import EmuRequest

VOCAB: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you",
    "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will",
    "would", "who", "so", "no", "she", "other", "its", "may", "these", "what", "them", "than", "some", "him",
    "time", "into", "only", "do", "model")
_WORDS = tuple((" " + w).encode() for w in VOCAB)
_MASK = len(VOCAB) - 1  # 64 words


class StreamOwner(Protocol):
    """What a stream needs of the server that opened it (:class:`inferasim.emulator.server.Emulator`)."""

    served_name: str
    engine: EngineLoop

    def stream_interval(self) -> float: ...


# ------------------------------------------------------------------------------------------------
# token sinks: what the engine calls when tokens of a request are due
# ------------------------------------------------------------------------------------------------

def _stream_head(keep: bool) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\nconnection: " + (b"keep-alive" if keep else b"close") +
            b"\r\nserver: inferasim-emulator\r\n\r\n")


class StreamSink:
    """Writes a request's tokens as OpenAI SSE events straight into its connection.

    One SSE event per token, as vLLM sends them. The first token and the last are written the
    moment they are due (they are what a client's TTFT and TPOT measure); tokens in between are
    written at most every `Emulator.stream_interval()` real seconds, several events per write
    (what SGLang's `--stream-interval` does), because a socket write per token per stream would
    cost more CPU than the emulated engine has real time at high speedups. The response head
    goes out with the first write."""

    def __init__(self, emulator: StreamOwner, writer: asyncio.StreamWriter, chat: bool, rid_text: str,
                 include_usage: bool, salt: int, keep: bool) -> None:
        self.emulator = emulator
        self.writer = writer
        self.salt = salt
        self.include_usage = include_usage
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.head = _stream_head(keep)
        self.last_write = 0.0
        model = json.dumps(emulator.served_name)
        created = int(time.time())
        if chat:
            head = (f'data: {{"id":"chatcmpl-{rid_text}","object":"chat.completion.chunk","created":{created},'
                    f'"model":{model},"choices":[').encode()
            self.role = head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,' \
                b'"finish_reason":null}]}\n\n'
            self.pre = head + b'{"index":0,"delta":{"content":"'
            self.mid = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
            self.last_tpl = b'"},"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
        else:
            head = (f'data: {{"id":"cmpl-{rid_text}","object":"text_completion","created":{created},'
                    f'"model":{model},"choices":[').encode()
            self.role = b""
            self.pre = head + b'{"index":0,"text":"'
            self.mid = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
            self.last_tpl = b'","logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n'
        self.usage_head = head

    def __call__(self, req: EmuRequest) -> bool:
        if self.closed:
            if req.finished and not self.done.done():
                self.done.set_result(None)
            return True
        if self.writer.transport.is_closing():
            self.closed = True
            self.emulator.engine.abort(req)
            if req.finished and not self.done.done():
                self.done.set_result(None)
            return True
        now = time.perf_counter()
        if req.sent and not req.finished and now - self.last_write < self.emulator.stream_interval():
            return False
        self.last_write = now
        head, self.head = self.head, b""
        parts: list[bytes] = []
        end = req.emitted
        if req.sent == 0 and end > 0 and self.role:
            parts.append(self.role)
        if end > req.sent:
            # pre + w1 + mid + pre + w2 + ... + wN + tail, in one join (the per-token hot path).
            salt = self.salt
            words = [_WORDS[(salt + i) & _MASK] for i in range(req.sent, end)]
            tail = self.last_tpl % req.reason.encode() if req.finished else self.mid
            parts.append(self.pre + (self.mid + self.pre).join(words) + tail)
        req.sent = end
        if req.finished:
            if req.error:
                parts.append(b"data: " + ApiError(500, req.error).body() + b"\n\n")
            if self.include_usage:
                usage = {"prompt_tokens": req.prompt, "total_tokens": req.prompt + end, "completion_tokens": end}
                parts.append(self.usage_head + b'],"usage":' + json.dumps(usage).encode() + b"}\n\n")
            parts.append(b"data: [DONE]\n\n")
            if not self.done.done():
                self.done.set_result(None)
        # One HTTP/1.1 chunk per write (chunked transfer keeps the connection for the next request).
        body = b"".join(parts)
        out = [head] if head else []
        if body:
            out += [b"%x\r\n" % len(body), body, b"\r\n"]
        if req.finished:
            out.append(b"0\r\n\r\n")
        if out:
            self.writer.write(b"".join(out))
        return True


class CollectSink:
    """Non-streamed requests: resolve a future at the finish."""

    def __init__(self) -> None:
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __call__(self, req: EmuRequest) -> bool:
        req.sent = req.emitted
        if req.finished and not self.done.done():
            self.done.set_result(None)
        return True


def synthetic_text(salt: int, n: int) -> str:
    return "".join(" " + VOCAB[(salt + i) & _MASK] for i in range(n))
