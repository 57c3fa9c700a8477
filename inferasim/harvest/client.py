"""Driving an OpenAI-compatible endpoint the way `vllm bench serve` does.

Each point is a closed loop: C clients, each sending a streamed `/v1/completions` request of
exactly `isl` prompt tokens (a list of random token ids, so no prefix cache can hit and no
tokenizer is needed) asking `osl` tokens with `ignore_eos`, and the next one when the previous is
done, until N requests have finished. Per request, as `vllm bench serve` measures it:
TTFT = first non-empty text chunk - send; latency = last non-empty text chunk - send;
TPOT = (latency - TTFT) / (output tokens - 1); the point reports the means over its requests.

Client cost: after the first token the stream is not JSON-decoded; chunks are split into SSE
events and counted, and only the usage event is parsed. The measured requests go through the
lean stdlib client of `rawhttp` for http:// endpoints (httpx for https://, or on request), and
httpx serves the control calls (/v1/models, /metrics). That keeps a Python client ahead of
dozens of fast streams, which matters for the measured times.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import numpy as np

from inferasim.errors import InferasimError
from inferasim.harvest.plan import PlanPoint
from inferasim.harvest.rawhttp import RawConnection, RawHTTPError


def _fast_missing_sniffio() -> None:
    """httpcore tries `import sniffio` on every request and falls back to asyncio when it is
    missing; a failed import is not cached, so each request repeats a search of sys.path, which
    costs milliseconds where file-system calls are slow (small VMs) and then distorts the
    measured latencies. Recording the absence in sys.modules makes the failure immediate; when
    sniffio is installed nothing changes."""
    import importlib.util
    import sys

    if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


_fast_missing_sniffio()

# Token ids drawn for random prompts: above the special tokens of common vocabularies and below
# the smallest vocabulary the catalog knows (32000).
TOKEN_ID_RANGE = (1000, 30000)


class HarvestError(InferasimError, RuntimeError):
    """The endpoint failed in a way that makes the measurement meaningless."""


@dataclass
class RequestResult:
    ttft: float  # real seconds
    latency: float  # real seconds, to the last text chunk
    output_tokens: int
    prompt_tokens: int


@dataclass
class PointResult:
    point: PlanPoint
    requests: list[RequestResult]
    wall_s: float  # real seconds from the first send to the last finish
    speedup: float
    failures: list[str] = field(default_factory=list)
    server: tuple[float, float] | None = None  # the engine's own (TTFT, TPOT) in engine seconds

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.requests) >= self.point.requests

    def ttft_s(self) -> float:
        """Mean TTFT in engine seconds (real x speedup)."""
        return float(np.mean([r.ttft for r in self.requests])) * self.speedup

    def tpot_s(self) -> float:
        vals = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in self.requests if r.output_tokens > 1]
        return float(np.mean(vals)) * self.speedup if vals else float("nan")

    def throughput(self) -> float:
        """Output tokens per engine second."""
        tokens = sum(r.output_tokens for r in self.requests)
        return tokens / (self.wall_s * self.speedup) if self.wall_s > 0 else float("nan")

    def summary(self) -> dict[str, float | int | str | None]:
        return {"point": self.point.label(), "requests": len(self.requests), "ttft_ms": self.ttft_s() * 1e3,
                "tpot_ms": self.tpot_s() * 1e3, "throughput_tok_s": self.throughput(), "wall_s": self.wall_s,
                "engine_ttft_ms": None if self.server is None else self.server[0] * 1e3,
                "engine_tpot_ms": None if self.server is None else self.server[1] * 1e3}


def completions_url(endpoint: str) -> str:
    return f"{base_url(endpoint)}/v1/completions"


def base_url(endpoint: str) -> str:
    url = endpoint.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint must be an http(s) URL such as http://127.0.0.1:8000, got {endpoint!r}")
    return url


# Seconds a control request (/v1/models, /metrics) may take. An engine answers them at once once it
# serves; one that accepts the connection and sends nothing is not serving yet (vLLM and SGLang
# open their port before the model is loaded only behind a proxy) or is not an OpenAI server.
CONTROL_TIMEOUT_S = 30.0


async def served_models(client: httpx.AsyncClient, endpoint: str, timeout: float = CONTROL_TIMEOUT_S) -> list[str]:
    try:
        r = await client.get(f"{base_url(endpoint)}/v1/models", timeout=timeout)
    except httpx.TimeoutException:
        raise HarvestError(f"{endpoint} sent no answer to GET /v1/models within {timeout:g} s: not an OpenAI-"
                           "compatible server, or one still loading its model (check `curl ENDPOINT/v1/models`)") \
            from None
    except httpx.HTTPError as exc:
        raise HarvestError(f"cannot reach {endpoint}: {exc!r}") from None
    if r.status_code != 200:
        raise HarvestError(f"{endpoint}/v1/models answered {r.status_code}: {r.text[:300]}")
    try:
        return [m["id"] for m in r.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HarvestError(f"{endpoint}/v1/models did not return an OpenAI model list") from None


# Where an engine says how it was launched, and the names of its parallel widths there: SGLang's
# GET /get_server_info returns its ServerArgs (tp_size, dp_size, ep_size, pp_size; sgl-project
# docs, "SGLang Native APIs"); vLLM's GET /server_info (served when VLLM_SERVER_DEV_MODE=1) the
# text of its VllmConfig, which spells tensor_parallel_size=N and the like. ATOM says nothing.
_SERVER_INFO = {"sglang": ("/get_server_info", {"tp": "tp_size", "dp": "dp_size", "ep": "ep_size", "pp": "pp_size"}),
                "vllm": ("/server_info", {"tp": "tensor_parallel_size", "dp": "data_parallel_size",
                                          "pp": "pipeline_parallel_size"})}


async def served_layout(client: httpx.AsyncClient, endpoint: str, engine: str,
                        timeout: float = CONTROL_TIMEOUT_S) -> dict[str, int] | None:
    """The parallel widths the endpoint says it runs (tp, dp, ep, pp; those it names), or None
    where it does not say (a vLLM without dev mode, ATOM, an unreachable route)."""
    route = _SERVER_INFO.get(engine)
    if route is None:
        return None
    path, names = route
    try:
        r = await client.get(f"{base_url(endpoint)}{path}", timeout=timeout)
        if r.status_code != 200:
            return None
        body = r.json()
    except (httpx.HTTPError, ValueError):
        return None
    out: dict[str, int] = {}
    if engine == "vllm":
        text = str(body.get("vllm_config", "")) if isinstance(body, dict) else ""
        for key, name in names.items():
            m = re.search(rf"\b{name}=(\d+)", text)
            if m:
                out[key] = int(m.group(1))
    elif isinstance(body, dict):
        for key, name in names.items():
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[key] = value
    return out or None


def layout_mismatch(said: dict[str, int] | None, given: dict[str, int]) -> str | None:
    """A sentence naming each width the endpoint reports unlike the harvest's flags; None when they
    agree or it reports nothing."""
    if not said:
        return None
    diffs = [f"--{k} {given[k]} but the endpoint runs {k} {v}" for k, v in said.items() if k in given and
             given[k] != v]
    return "; ".join(diffs) or None


# Metric name prefixes of each engine's /metrics (engine-facts notes 1.1, 2).
ENGINE_METRIC_PREFIXES = {"vllm": "vllm:", "sglang": "sglang:", "atom": "atom:"}


async def served_engine(client: httpx.AsyncClient, endpoint: str, timeout: float = CONTROL_TIMEOUT_S) -> str | None:
    """The engine an endpoint is, by the prefix of its /metrics series (vllm:, sglang:, atom:), else
    by the `owned_by` of its /v1/models entries; None when neither says."""
    seen: set[str] = set()
    try:
        r = await client.get(f"{base_url(endpoint)}/metrics", timeout=timeout)
        if r.status_code == 200:
            for line in r.text.splitlines():
                if line and not line.startswith("#"):
                    seen.update(e for e, pre in ENGINE_METRIC_PREFIXES.items() if line.startswith(pre))
        if len(seen) != 1:
            r = await client.get(f"{base_url(endpoint)}/v1/models", timeout=timeout)
            listed = r.json().get("data", []) if r.status_code == 200 else []
            seen = {str(m.get("owned_by", "")).lower() for m in listed} & set(ENGINE_METRIC_PREFIXES)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return None
    return seen.pop() if len(seen) == 1 else None


async def _scrape_sums(client: httpx.AsyncClient, endpoint: str, wanted: dict[str, str],
                       timeout: float = CONTROL_TIMEOUT_S) -> dict[str, float] | None:
    """The engine's /metrics samples named in `wanted` (sample name -> key), summed per key over
    all series; only the keys seen. None when /metrics is unreachable, not 200, or unparsable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        r = await client.get(f"{base_url(endpoint)}/metrics", timeout=timeout)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    out: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(r.text):
            for smp in fam.samples:
                key = wanted.get(smp.name)
                if key is not None:
                    out[key] = out.get(key, 0.0) + float(smp.value)
    except ValueError:
        return None
    return out


async def scrape_counters(client: httpx.AsyncClient, endpoint: str, engine: str,
                          timeout: float = CONTROL_TIMEOUT_S) -> dict[str, float] | None:
    """Prompt and generation token counters summed over all series; None without /metrics.

    Names: vLLM `vllm:prompt_tokens_total` / `vllm:generation_tokens_total`, SGLang
    `sglang:prompt_tokens_total` / `sglang:generation_tokens_total` (engine-facts notes 1.1, 2)."""
    prefix = {"sglang": "sglang:", "atom": "atom:"}.get(engine, "vllm:")
    sums = await _scrape_sums(client, endpoint, {f"{prefix}prompt_tokens_total": "prompt_tokens",
                                                 f"{prefix}generation_tokens_total": "generation_tokens"}, timeout)
    if not sums:
        return None
    return {"prompt_tokens": 0.0, "generation_tokens": 0.0, **sums}


async def scrape_latency(client: httpx.AsyncClient, endpoint: str, engine: str,
                         timeout: float = CONTROL_TIMEOUT_S) -> dict[str, float] | None:
    """Sums and counts of the engine's TTFT and end-to-end latency histograms (all series); None
    when /metrics lacks them. vLLM `vllm:time_to_first_token_seconds` and
    `vllm:e2e_request_latency_seconds` (notes 1.2), SGLang `sglang:...` of the same names
    (notes 2; SGLang exports them only with --enable-metrics)."""
    prefix = {"sglang": "sglang:"}.get(engine, "vllm:")
    keys = {f"{prefix}time_to_first_token_seconds_sum": "ttft_sum",
            f"{prefix}time_to_first_token_seconds_count": "ttft_count",
            f"{prefix}e2e_request_latency_seconds_sum": "e2e_sum",
            f"{prefix}e2e_request_latency_seconds_count": "e2e_count"}
    sums = await _scrape_sums(client, endpoint, keys, timeout)
    return sums if sums is not None and len(sums) == 4 else None


def server_means(before: dict[str, float] | None, after: dict[str, float] | None, requests: int,
                 osl: int) -> tuple[float, float] | None:
    """The engine's own mean TTFT and TPOT (seconds) over one point, from histogram deltas:
    TPOT = (mean e2e - mean TTFT) / (osl - 1) for fixed-length outputs. None unless the deltas
    count exactly the point's requests (other traffic, or no histograms)."""
    if before is None or after is None:
        return None
    n = after["ttft_count"] - before["ttft_count"]
    if n != requests or after["e2e_count"] - before["e2e_count"] != requests:
        return None
    ttft = (after["ttft_sum"] - before["ttft_sum"]) / n
    e2e = (after["e2e_sum"] - before["e2e_sum"]) / n
    return ttft, (e2e - ttft) / max(osl - 1, 1)


def _payload(model: str, prompt: list[int], osl: int) -> dict[str, object]:
    # As vllm bench serve sends it: ignore_eos fixes the output length (no other engine-specific fields).
    return {"model": model, "prompt": prompt, "max_tokens": osl, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}


class Streamer:
    """Sends one streamed completion and yields its body: `RawConnection` (one keep-alive
    connection per closed-loop client; see rawhttp.py for why) or a shared httpx client."""

    def __init__(self, endpoint: str, timeout: float, client: httpx.AsyncClient | None = None) -> None:
        self.url = completions_url(endpoint)
        self.httpx = client
        self.raw = None if client is not None else RawConnection(base_url(endpoint), timeout)

    async def stream(self, payload: dict[str, object]) -> AsyncIterator[bytes]:
        if self.raw is not None:
            try:
                async for chunk in self.raw.post_stream("/v1/completions", payload):
                    yield chunk
            except (RawHTTPError, asyncio.IncompleteReadError) as exc:
                self.raw.close()
                raise HarvestError(f"{self.url}: {exc}") from None
            except BaseException:
                self.raw.close()  # a response left half-read cannot carry the next request
                raise
            return
        assert self.httpx is not None
        async with self.httpx.stream("POST", self.url, json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread())[:500].decode(errors="replace")
                raise HarvestError(f"{self.url} answered {resp.status_code}: {body}")
            async for chunk in resp.aiter_bytes():
                yield chunk

    async def connect(self) -> None:
        if self.raw is not None:
            try:
                await self.raw.connect()
            except (OSError, TimeoutError) as exc:
                raise HarvestError(f"cannot connect to {self.url}: {exc!r}") from None

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()


async def one_request(streamer: Streamer, payload: dict[str, object]) -> RequestResult:
    t0 = time.perf_counter()
    ttft: float | None = None
    last: float | None = None
    events = 0
    usage: dict[str, int] | None = None
    buf = b""
    async for chunk in streamer.stream(payload):
        now = time.perf_counter()
        buf += chunk
        if b"\n\n" not in buf:
            continue
        *complete, buf = buf.split(b"\n\n")
        for ev in complete:
            ev = ev.strip()
            if not ev.startswith(b"data:"):
                continue
            data = ev[5:].strip()
            if data == b"[DONE]":
                continue
            if ttft is None or b'"usage"' in data or b'"error"' in data:
                obj = json.loads(data)
                if obj.get("error"):
                    raise HarvestError(f"{streamer.url} streamed an error: {str(obj['error'])[:300]}")
                if obj.get("usage"):
                    usage = obj["usage"]
                if not _has_text(obj):
                    continue
                if ttft is None:
                    ttft = now - t0
            elif b'"text":""' in data or b'"content":""' in data:
                continue
            last = now
            events += 1
    if ttft is None or last is None:
        raise HarvestError(f"{streamer.url} streamed no text")
    out = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else events
    prompt = int(usage["prompt_tokens"]) if usage and usage.get("prompt_tokens") else len(payload["prompt"])  # type: ignore[arg-type]
    return RequestResult(ttft=ttft, latency=last - t0, output_tokens=out, prompt_tokens=prompt)


def _has_text(obj: dict[str, object]) -> bool:
    choices = obj.get("choices") or []
    if not isinstance(choices, list) or not choices:
        return False
    c = choices[0]
    if not isinstance(c, dict):
        return False
    text = c.get("text")
    if text is None and isinstance(c.get("delta"), dict):
        text = c["delta"].get("content")  # type: ignore[union-attr]
    return bool(text)


def make_streamers(n: int, endpoint: str, timeout: float, client: httpx.AsyncClient,
                   transport: str = "auto") -> list[Streamer]:
    """`n` streamers: raw connections for http:// with transport auto|raw, else httpx."""
    if transport not in ("auto", "raw", "httpx"):
        raise ValueError(f"unknown client transport {transport!r}; use auto, raw or httpx")
    use_raw = transport == "raw" or (transport == "auto" and base_url(endpoint).startswith("http://"))
    return [Streamer(endpoint, timeout, None if use_raw else client) for _ in range(n)]


async def run_point(client: httpx.AsyncClient, endpoint: str, model: str, point: PlanPoint, speedup: float,
                    deadline: float, rng: np.random.Generator, transport: str = "auto",
                    timeout: float = 600.0) -> PointResult:
    """Closed loop of `point.concurrency` clients until `point.requests` have finished, or until
    `deadline` (time.perf_counter()), when in-flight requests are cancelled."""
    n_clients = min(point.concurrency, point.requests)
    streamers = make_streamers(n_clients, endpoint, timeout, client, transport)
    prompts = [rng.integers(*TOKEN_ID_RANGE, size=point.isl).tolist() for _ in range(point.requests)]
    results: list[RequestResult] = []
    failures: list[str] = []
    next_index = 0

    async def client_loop(streamer: Streamer) -> None:
        nonlocal next_index
        while next_index < point.requests and not failures:
            i = next_index
            next_index += 1
            try:
                results.append(await one_request(streamer, _payload(model, prompts[i], point.osl)))
            except (HarvestError, httpx.HTTPError, ValueError, OSError, TimeoutError) as exc:
                failures.append(f"{type(exc).__name__}: {exc}")

    try:
        await asyncio.gather(*(st.connect() for st in streamers))
    except HarvestError as exc:
        for st in streamers:
            st.close()
        return PointResult(point=point, requests=[], wall_s=0.0, speedup=speedup, failures=[str(exc)])
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(client_loop(st)) for st in streamers]
    try:
        done, pending = await asyncio.wait(tasks, timeout=max(deadline - t0, 0.0))
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            failures.append(f"stopped by the time budget after {len(results)} of {point.requests} requests")
    finally:
        for st in streamers:
            st.close()
    return PointResult(point=point, requests=results, wall_s=time.perf_counter() - t0, speedup=speedup,
                       failures=failures)


async def warm_up(client: httpx.AsyncClient, endpoint: str, model: str, rng: np.random.Generator,
                  transport: str = "auto", timeout: float = 600.0) -> None:
    """One short request: graph capture and lazy initialisation must not land in the first point."""
    prompt = rng.integers(*TOKEN_ID_RANGE, size=16).tolist()
    (streamer,) = make_streamers(1, endpoint, timeout, client, transport)
    try:
        await one_request(streamer, _payload(model, prompt, 4))
    finally:
        streamer.close()
