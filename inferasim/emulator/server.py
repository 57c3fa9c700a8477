"""The emulator's OpenAI-compatible HTTP server (standard library asyncio, no web framework).

Routes: `GET /health`, `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`
(with and without `"stream": true`), `GET /metrics`, `GET /version`, and the emulator's own
`GET|POST /_inferasim/params` (read / change the step-time parameters at run time) and
`GET /_inferasim/stats`.

Why a hand-written HTTP/1.1 server: the project avoids a web-framework dependency, and the token
path must be cheap (pre-encoded SSE byte templates, one socket write per stream per delivery).
Responses keep the connection alive; streamed ones are `text/event-stream` with chunked transfer
encoding, as uvicorn serves vLLM's. A stream's intermediate tokens are coalesced into one write
at most every `Emulator.stream_interval()` real seconds, while its first and last tokens go out
the moment they are due (see StreamSink): socket calls, not the engine, are what limit a real-time
emulator at high speedups, and a client's TTFT and TPOT only depend on those two tokens.

Token counting (:mod:`inferasim.emulator.prompts`): one token per word of a prompt, or per token
id; generated tokens are words of a fixed vocabulary (:mod:`inferasim.emulator.sinks`), so the text
of N generated tokens is again N tokens. The emulator in a child process is
:mod:`inferasim.emulator.process`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from inferasim.emulator.api import ApiError, merge_params, server_info
from inferasim.emulator.config import EmulatorConfig, Resolved, resolve
from inferasim.emulator.engine import EngineLoop, EngineUnavailable, RequestRejected, emulated_capacity_note
from inferasim.emulator.metrics import EngineMetrics
from inferasim.emulator.prompts import chat_prompt_length, int_field, prompt_lengths
from inferasim.emulator.request import EmuRequest
from inferasim.emulator.sinks import CollectSink, StreamSink, synthetic_text
from inferasim.emulator.timing import VirtualClock, new_event_loop
from inferasim.model.steptime import StepParams

MAX_HEADER_BYTES = 256 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
STREAM_INTERVAL_BASE = 0.02
STREAM_INTERVAL_PER_REQUEST = 0.001
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI / vLLM default for /v1/completions

_REASONS = {200: "OK", 100: "Continue", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


# ------------------------------------------------------------------------------------------------
# the emulator
# ------------------------------------------------------------------------------------------------

class Emulator:
    """Engine loop + HTTP server on one asyncio loop."""

    def __init__(self, resolved: Resolved) -> None:
        self.resolved = resolved
        cfg = resolved.config
        self.served_name = resolved.served_name
        self.clock = VirtualClock(cfg.speedup)
        kv_tokens = int(resolved.sched.kv_tokens * resolved.params.kv_scale)
        self.metrics = EngineMetrics(resolved.engine, self.served_name, resolved.layout.dp, resolved.max_model_len,
                                     resolved.sched.block_size, kv_tokens, resolved.layout.tp, resolved.layout.pp)
        stall = (cfg.stall_at_batch, cfg.stall_s) if cfg.stall_at_batch is not None else None
        self.engine = EngineLoop(resolved.params, resolved.cost, resolved.sched, self.metrics, self.clock, stall)
        self.rng = np.random.default_rng(cfg.seed)
        self.created = int(time.time())
        self.host = cfg.host
        self.port: int | None = None
        self._server: asyncio.base_events.Server | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopped: asyncio.Event | None = None

    # ---- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        self._stopped = asyncio.Event()
        self._server = await asyncio.start_server(self._handle_conn, self.host, self.resolved.config.port,
                                                  limit=MAX_HEADER_BYTES, backlog=4096)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._engine_task = asyncio.create_task(self.engine.run())

    async def stop(self) -> None:
        self.engine.stop()
        if self._server is not None:
            self._server.close()
        for w in list(self._conns):
            w.close()
        # Connection handlers end with their connections; cancel any still waiting (a request
        # queued in the engine) so that the loop closes without pending tasks.
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        if self._engine_task is not None:
            try:
                await asyncio.wait_for(self._engine_task, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._engine_task.cancel()
        if self._stopped is not None:
            self._stopped.set()

    async def wait_stopped(self) -> None:
        assert self._stopped is not None
        await self._stopped.wait()

    def stream_interval(self) -> float:
        """Real seconds between writes of a stream's intermediate tokens: the configured value,
        or by default 20 ms plus 1 ms per open request (so that the writes per second stay
        bounded however many streams are open)."""
        fixed = self.resolved.config.stream_interval
        if fixed is not None:
            return fixed
        return STREAM_INTERVAL_BASE + STREAM_INTERVAL_PER_REQUEST * self.engine.open

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def describe(self) -> str:
        r = self.resolved
        return (f"{r.engine} {r.model.name} on {r.layout.label()} x {r.gpu.name} ({r.precision}), speedup "
                f"{self.clock.speedup:g}, parameters: {r.params_source}, "
                f"{emulated_capacity_note(r.sched, r.params)}")

    # ---- HTTP ------------------------------------------------------------------------------------
    async def _handle_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    await self._send(writer, 431, ApiError(431, "request headers too large").body(), keep=False)
                    return
                try:
                    method, target, version, headers = _parse_head(head)
                except ValueError as exc:
                    await self._send(writer, 400, ApiError(400, str(exc)).body(), keep=False)
                    return
                if headers.get("expect", "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                try:
                    body = await _read_body(reader, headers)
                except ApiError as exc:
                    await self._send(writer, exc.status, exc.body(), keep=False)
                    return
                conn = headers.get("connection", "").lower()
                keep = (version == "HTTP/1.1" and conn != "close") or (version == "HTTP/1.0" and conn == "keep-alive")
                close = await self._dispatch(method, target, body, reader, writer, keep)
                if close or not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            return
        finally:
            self._conns.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, keep: bool,
                    content_type: str = "application/json") -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(body)}\r\nconnection: {'keep-alive' if keep else 'close'}\r\n"
                f"server: inferasim-emulator\r\n\r\n").encode()
        writer.write(head + body)
        await writer.drain()

    async def _dispatch(self, method: str, target: str, body: bytes, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, keep: bool) -> bool:
        """Answer one request. True when the connection must close (a stream the client left)."""
        path = urlsplit(target).path.rstrip("/") or "/"
        routes: dict[str, dict[str, Callable[..., Any]]] = {
            "/health": {"GET": self._health},
            "/ping": {"GET": self._health},
            "/version": {"GET": self._version},
            "/v1/models": {"GET": self._models},
            "/metrics": {"GET": self._metrics},
            # How the engine was launched, where each engine says it (harvest's layout check).
            **({"/get_server_info": {"GET": self._server_info}} if self.resolved.engine == "sglang" else
               {"/server_info": {"GET": self._server_info}} if self.resolved.engine == "vllm" else {}),
            "/v1/completions": {"POST": self._completions},
            "/v1/chat/completions": {"POST": self._chat},
            "/_inferasim/params": {"GET": self._get_params, "POST": self._post_params},
            "/_inferasim/stats": {"GET": self._stats},
        }
        try:
            handlers = routes.get(path)
            if handlers is None:
                raise ApiError(404, f"no route {path}; this server offers {', '.join(sorted(routes))}")
            handler = handlers.get("GET" if method == "HEAD" else method)
            if handler is None:
                raise ApiError(405, f"{method} is not allowed on {path}; use {', '.join(handlers)}")
            if path in ("/v1/completions", "/v1/chat/completions"):
                result = await handler(_parse_json(body), reader, writer, keep)
            elif method == "POST":
                result = await handler(_parse_json(body))
            else:
                result = await handler()
        except ApiError as exc:
            await self._send(writer, exc.status, exc.body(), keep)
            return False
        except EngineUnavailable as exc:
            await self._send(writer, 503, ApiError(503, f"the engine is not available: {exc}").body(), keep)
            return False
        except Exception as exc:  # the emulator's own bug: answer 500 rather than drop the connection
            await self._send(writer, 500, ApiError(500, f"emulator error: {exc!r}").body(), keep)
            return False
        if isinstance(result, bool):  # streamed: True when the client went away
            return result
        status, payload, ctype = result
        await self._send(writer, status, payload if method != "HEAD" else b"", keep, ctype)
        return False

    # ---- simple routes ---------------------------------------------------------------------------
    async def _health(self) -> tuple[int, bytes, str]:
        if self.engine.crashed:
            raise ApiError(503, f"emulated engine crashed: {self.engine.crashed}")
        return 200, b"", "application/json"

    async def _version(self) -> tuple[int, bytes, str]:
        ver = self.resolved.config.engine_version or "emulated"
        return 200, json.dumps({"version": ver, "emulator": "inferasim"}).encode(), "application/json"

    async def _models(self) -> tuple[int, bytes, str]:
        owner = "sglang" if self.resolved.engine == "sglang" else "vllm"
        card = {"id": self.served_name, "object": "model", "created": self.created, "owned_by": owner,
                "root": self.resolved.model.name, "parent": None, "max_model_len": self.resolved.max_model_len}
        return 200, json.dumps({"object": "list", "data": [card]}).encode(), "application/json"

    async def _server_info(self) -> tuple[int, bytes, str]:
        info = server_info(self.resolved.engine, self.resolved.model.name, self.resolved.config)
        return 200, json.dumps(info).encode(), "application/json"

    async def _metrics(self) -> tuple[int, bytes, str]:
        return 200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST

    async def _stats(self) -> tuple[int, bytes, str]:
        return 200, json.dumps(self.engine.stats()).encode(), "application/json"

    async def _get_params(self) -> tuple[int, bytes, str]:
        return 200, json.dumps({"params": self.engine.params.as_dict()}).encode(), "application/json"

    async def _post_params(self, body: dict[str, Any]) -> tuple[int, bytes, str]:
        values = body.get("params", body)
        if not isinstance(values, dict) or not values:
            raise ApiError(400, "send a JSON object of step-time parameters, e.g. {\"t_fixed\": 0.005}")
        self.engine.set_params(merge_params(self.engine.params, values))
        return await self._get_params()

    # ---- completions -------------------------------------------------------------------------------
    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.served_name:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")

    def _plan_output(self, body: dict[str, Any], prompt: int, default_max: int | None) -> tuple[int, int, str]:
        limit = min(self.resolved.max_model_len, self.engine.max_request_tokens())
        max_tokens = int_field(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = int_field(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = default_max if default_max is not None else max(limit - prompt, 1)
        if prompt + max_tokens > self.resolved.max_model_len:
            raise ApiError(400, f"This model's maximum context length is {self.resolved.max_model_len} tokens. "
                                f"However, you requested {prompt + max_tokens} tokens ({prompt} in the messages, "
                                f"{max_tokens} in the completion). Please reduce the length of the messages or "
                                "completion.", "max_tokens")
        min_tokens = int_field(body, "min_tokens", 0) or 0
        ignore_eos = body.get("ignore_eos", False)
        if not isinstance(ignore_eos, bool):
            raise ApiError(400, f"ignore_eos must be true or false, got {ignore_eos!r}", "ignore_eos")
        if ignore_eos:
            return max_tokens, max_tokens, "length"
        natural = int(self.rng.geometric(1.0 / max(self.resolved.config.natural_output_mean, 1)))
        out = min(max(natural, min_tokens, 1), max_tokens)
        return out, max_tokens, "length" if natural >= max_tokens else "stop"

    async def _completions(self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           keep: bool) -> tuple[int, bytes, str] | bool:
        self._check_model(body)
        if "prompt" not in body:
            raise ApiError(400, "prompt is required", "prompt")
        return await self._serve(body, prompt_lengths(body["prompt"]), False, reader, writer, keep)

    async def _chat(self, body: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    keep: bool) -> tuple[int, bytes, str] | bool:
        self._check_model(body)
        return await self._serve(body, [chat_prompt_length(body.get("messages"))], True, reader, writer, keep)

    async def _serve(self, body: dict[str, Any], prompts: list[int], chat: bool, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter, keep: bool) -> tuple[int, bytes, str] | bool:
        """A JSON response, or (streamed) whether the connection must close."""
        n = int_field(body, "n", 1)
        if n not in (None, 1):
            raise ApiError(400, "the emulator serves n = 1 only", "n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(400, f"stream must be true or false, got {stream!r}", "stream")
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise ApiError(400, "stream_options must be an object", "stream_options")
        include_usage = bool(opts.get("include_usage", False))
        default_max = None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
        plans = [self._plan_output(body, p, default_max) for p in prompts]
        rid_text = uuid.uuid4().hex
        if stream:
            if len(prompts) != 1:
                raise ApiError(400, "the emulator streams one prompt per request; send a batch without stream",
                               "prompt")
            out, max_tokens, reason = plans[0]
            salt = int(self.rng.integers(0, 1 << 16))
            sink = StreamSink(self, writer, chat, rid_text, include_usage, salt, keep)
            try:
                req = self.engine.submit(prompts[0], out, max_tokens, reason, sink)
            except RequestRejected as exc:
                raise ApiError(400, str(exc), "max_tokens") from None
            watcher = asyncio.create_task(self._watch_disconnect(reader, req))
            try:
                await sink.done
                await writer.drain()
            except ConnectionError:
                self.engine.abort(req)
                return True
            finally:
                # Wait until the watch has really stopped: until then it holds the reader, and
                # the next request on this connection could not be read.
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            return sink.closed
        sinks: list[CollectSink] = []
        reqs: list[EmuRequest] = []
        salts: list[int] = []
        for p, (out, max_tokens, reason) in zip(prompts, plans, strict=True):
            sink = CollectSink()
            try:
                reqs.append(self.engine.submit(p, out, max_tokens, reason, sink))
            except RequestRejected as exc:
                for r in reqs:
                    self.engine.abort(r)
                raise ApiError(400, str(exc), "max_tokens") from None
            sinks.append(sink)
            salts.append(int(self.rng.integers(0, 1 << 16)))
        # Not watched for disconnects: a kept-alive connection's next request would be read away.
        await asyncio.gather(*(s.done for s in sinks))
        failed = [r.error for r in reqs if r.error]
        if failed:
            raise ApiError(500, failed[0])
        choices = []
        prompt_total = completion_total = 0
        for i, (req, salt) in enumerate(zip(reqs, salts, strict=True)):
            text = synthetic_text(salt, req.emitted)
            prompt_total += req.prompt
            completion_total += req.emitted
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text, "tool_calls": []},
                                "logprobs": None, "finish_reason": req.reason, "stop_reason": None})
            else:
                choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": req.reason,
                                "stop_reason": None, "prompt_logprobs": None})
        payload = {"id": ("chatcmpl-" if chat else "cmpl-") + rid_text,
                   "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                   "model": self.served_name, "choices": choices,
                   "usage": {"prompt_tokens": prompt_total, "total_tokens": prompt_total + completion_total,
                             "completion_tokens": completion_total, "prompt_tokens_details": None}}
        return 200, json.dumps(payload).encode(), "application/json"

    async def _watch_disconnect(self, reader: asyncio.StreamReader, *reqs: EmuRequest) -> None:
        """EOF from the client while its response streams means it went away. (A client sends
        nothing while it reads a response, so waiting for EOF consumes no request bytes; the
        watch is cancelled as soon as the response is complete.)"""
        try:
            await _wait_eof(reader)
        except (ConnectionError, asyncio.CancelledError, AttributeError, RuntimeError):
            return
        for req in reqs:
            self.engine.abort(req)


async def _wait_eof(reader: asyncio.StreamReader) -> None:
    """Return when the peer has closed its side, without consuming buffered bytes."""
    while not reader.at_eof():
        # StreamReader has no public "wait for more data"; its _wait_for_data returns on new data
        # or EOF and leaves the buffer alone (AttributeError on a Python without it: no watch).
        await reader._wait_for_data("inferasim-eof-watch")


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"JSON decode error: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:
        raise ValueError("request head is not latin-1 text") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"malformed request line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return parts[0].upper(), parts[1], parts[2], headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        size = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                n = int(line.split(b";")[0].strip() or b"0", 16)
            except ValueError:
                raise ApiError(400, f"bad chunk size line {line[:40]!r} in a chunked request body") from None
            if n == 0:
                await reader.readuntil(b"\r\n")  # trailer end (no trailers expected)
                return b"".join(chunks)
            size += n
            if size > MAX_BODY_BYTES:
                raise ApiError(413, f"request body above {MAX_BODY_BYTES} bytes")
            chunks.append(await reader.readexactly(n))
            await reader.readexactly(2)
    length = headers.get("content-length")
    if length is None:
        return b""
    try:
        n = int(length)
    except ValueError:
        raise ApiError(400, f"bad content-length {length!r}") from None
    if n < 0 or n > MAX_BODY_BYTES:
        raise ApiError(413, f"request body of {n} bytes; the limit is {MAX_BODY_BYTES}")
    return await reader.readexactly(n)


# ------------------------------------------------------------------------------------------------
# running it: a background thread (tests, notebooks) or the foreground (the CLI)
# ------------------------------------------------------------------------------------------------

class EmulatorHandle:
    """A running emulator on its own thread and event loop. `url`, `stop()`, `set_params()`."""

    def __init__(self, emulator: Emulator, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        self.emulator = emulator
        self._loop = loop
        self._thread = thread

    @property
    def url(self) -> str:
        return self.emulator.url

    @property
    def port(self) -> int:
        assert self.emulator.port is not None
        return self.emulator.port

    @property
    def served_model_name(self) -> str:
        return self.emulator.served_name

    @property
    def resolved(self) -> Resolved:
        return self.emulator.resolved

    @property
    def params(self) -> StepParams:
        return self.emulator.engine.params

    def set_params(self, params: StepParams) -> None:
        """Change the step-time parameters from the next engine step on (thread-safe)."""
        if not isinstance(params, StepParams):
            raise TypeError(f"set_params takes StepParams, got {type(params).__name__}")
        self._call(lambda: self.emulator.engine.set_params(params))

    def stats(self) -> dict[str, Any]:
        return self._call(self.emulator.engine.stats)

    def metrics_text(self) -> str:
        return self._call(lambda: generate_latest(self.emulator.metrics.registry).decode())

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10.0)

    def stop(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.emulator.stop(), self._loop).result(timeout=timeout)
        except (RuntimeError, TimeoutError):
            pass
        self._thread.join(timeout=timeout)

    def __enter__(self) -> EmulatorHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_emulator(config: EmulatorConfig, ready_timeout: float = 30.0) -> EmulatorHandle:
    """Start an emulator on a background (daemon) thread; returns once it accepts connections.

    ValueError for a bad configuration (unknown model, GPU, engine, layout), raised here."""
    resolved = resolve(config)
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        box["loop"] = loop
        try:
            emulator = Emulator(resolved)
            box["emulator"] = emulator
            loop.run_until_complete(emulator.start())
        except BaseException as exc:  # surfaced to the caller of start_emulator
            box["error"] = exc
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_until_complete(emulator.wait_stopped())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    thread = threading.Thread(target=main, name="inferasim-emulator", daemon=True)
    thread.start()
    if not ready.wait(ready_timeout):
        raise RuntimeError(f"the emulator did not start within {ready_timeout} s")
    if "error" in box:
        exc = box["error"]
        if isinstance(exc, OSError):
            raise ValueError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
        raise exc
    return EmulatorHandle(box["emulator"], box["loop"], thread)


def run_foreground(config: EmulatorConfig, announce: Callable[[str], None] | None = None) -> int:
    """Serve until SIGINT / SIGTERM (the CLI). Returns the exit code."""
    import signal

    resolved = resolve(config)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    emulator = Emulator(resolved)
    try:
        loop.run_until_complete(emulator.start())
    except OSError as exc:
        loop.close()
        raise ValueError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(emulator.stop()))
        except (NotImplementedError, RuntimeError):
            pass
    if announce is not None:
        announce(f"inferasim emulator: {emulator.describe()}; listening on {emulator.url}")
    try:
        loop.run_until_complete(emulator.wait_stopped())
    finally:
        loop.close()
    return 0
