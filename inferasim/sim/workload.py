"""Workloads of the trace simulator: open-loop Poisson, closed loop, multi-turn sessions and trace
replay (Mooncake JSONL, Azure CSV). DESIGN.md section 4.

A workload is a *driver*: `start(submit)` hands the requests known up front to the simulator
(`submit(req, t)`), `on_finish(req, submit)` the ones that a finish causes (the next request of a
closed-loop client, the next turn of a session). `requests` lists every client request issued.

Prefix identity (see `inferasim.sim.prefix`): a Mooncake request's `hash_ids` name 512-token
blocks and equal ids mean a shareable prefix; they become chained keys so that a key names its
whole prefix. A multi-turn session numbers the 512-token units of its conversation (prompt = the
previous prompt + the answer + new user tokens), so a turn's prompt matches the previous turn's
prompt and answer. Poisson and closed-loop requests have random prompts, except for a head common
to all of them when the workload states an observed `prefixHitRate` (a system prompt of that share
of the prompt); Azure requests have no identity.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO

import numpy as np

from inferasim.core.spec import StaticWorkload, TraceWorkload
from inferasim.errors import UserError
from inferasim.sim.collector import paused_collector
from inferasim.sim.request import SimRequest

MOONCAKE_BLOCK = 512  # tokens per hash id (Mooncake FAST'25 traces)
SESSION_UNIT = 512  # tokens per prefix unit of a synthetic session

Submit = Callable[[SimRequest, float], None]


class WorkloadError(UserError):
    """A workload or trace that cannot be used; the message names the field or line."""


class Driver:
    """Base: a fixed list of requests arriving at given times (open loop)."""

    closed = False  # finishes cause new requests

    def __init__(self, requests: list[SimRequest]) -> None:
        self.requests = requests

    def start(self, submit: Submit) -> None:
        for req in self.requests:
            submit(req, req.arrival)

    def on_finish(self, req: SimRequest, submit: Submit) -> None:  # noqa: B027 - open loop: nothing follows
        """Open loop: a finish causes nothing."""

    @property
    def span(self) -> float:
        """Arrival span known up front (0 when arrivals depend on completions)."""
        if not self.requests:
            return 0.0
        arrivals = [r.arrival for r in self.requests]  # one pass over the requests, not two
        return max(arrivals) - min(arrivals)

    def stream(self) -> Iterator[list[SimRequest]] | None:
        """The requests in arrival-ordered batches, made as the simulation reaches them (None: all
        up front, by `start`)."""
        return None


class StreamDriver(Driver):
    """Open loop over an iterable of requests in order of arrival, read a batch at a time as the
    simulation reaches it: with `simulate_workload(..., records=False)` a replay's memory does not
    grow with the trace's length. `span`: the arrival span, if known (it spaces the report's
    time series). Routed request by request (a router other than round robin over several
    replicas), the requests are all read first."""

    BATCH = 2048

    def __init__(self, source: Iterable[SimRequest], span: float = 0.0) -> None:
        super().__init__([])
        self.source = source
        self._span = float(span)

    @property
    def span(self) -> float:
        return self._span

    def start(self, submit: Submit) -> None:
        for batch in self._batches():
            for req in batch:
                submit(req, req.arrival)

    def stream(self) -> Iterator[list[SimRequest]] | None:
        return self._batches()

    def _batches(self) -> Iterator[list[SimRequest]]:
        batch: list[SimRequest] = []
        last = -math.inf
        for req in self.source:
            if req.arrival < last:
                raise WorkloadError(f"streamed request {req.rid} arrives at {req.arrival} s, before the one "
                                    f"before it ({last} s): a stream must come in order of arrival")
            last = req.arrival
            batch.append(req)
            if len(batch) >= self.BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


def chain_keys(ids: list[int] | tuple[int, ...], salt: int = 0) -> tuple[int, ...]:
    """Chained keys: key j stands for ids[0..j] (equal keys = equal prefix)."""
    out = []
    k = salt
    for h in ids:
        k = hash((k, int(h)))
        out.append(k)
    return tuple(out)


# -- traces ----------------------------------------------------------------------------------------

def _fmt(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    name = path.name.lower()
    if name.endswith((".jsonl", ".json", ".jsonl.gz")):
        return "mooncake"
    if name.endswith((".csv", ".csv.gz")):
        return "azure"
    raise WorkloadError(f"trace {path}: cannot tell the format from the name; give format mooncake or azure")


def _check_file(p: Path) -> None:
    if not p.exists():
        raise WorkloadError(f"trace file {p} does not exist")
    if not p.is_file():
        raise WorkloadError(f"trace {p} is not a file")


def _open_text(p: Path) -> IO[str]:
    """The trace file as text (gzip when its name ends in .gz); WorkloadError when it cannot be read."""
    _check_file(p)
    try:
        if p.name.lower().endswith(".gz"):
            return gzip.open(p, "rt", newline="")
        return p.open(newline="")
    except OSError as exc:
        raise WorkloadError(f"trace file {p} cannot be read: {exc.strerror or exc}") from None


# What reading can raise beyond decoding: a .gz name over content that is not gzip (BadGzipFile is
# an OSError), a truncated gzip stream (EOFError), corrupt deflate data (zlib.error).
_READ_ERRORS = (OSError, EOFError, zlib.error)


def _unreadable(p: Path, exc: BaseException) -> WorkloadError:
    hint = " (the name ends in .gz: is it gzip?)" if p.name.lower().endswith(".gz") else ""
    return WorkloadError(f"trace file {p} cannot be read: {exc}{hint}")


def _tokens(value: object, minimum: int = 1) -> int:
    """A token count of a trace record: a whole number >= `minimum` (ValueError otherwise). Read
    strictly: 100.7 or -100 tokens is a broken trace, not a request of 100 or 1 tokens."""
    if isinstance(value, bool):
        raise ValueError(value)
    number = float(value) if isinstance(value, int | float) else float(str(value).strip())
    if not math.isfinite(number) or number != int(number) or number < minimum:
        raise ValueError(value)
    return int(number)


def _output_tokens(value: object) -> int:
    """An output count: 0 (a request cut off at its first token) runs as the one token every
    engine emits; negative or fractional counts are errors."""
    return max(_tokens(value, 0), 1)


def _mooncake_error(d: object, p: Path, lineno: int) -> WorkloadError:
    """Why record `d` is not a Mooncake record, naming the field (only called once reading it failed)."""
    where = f"{p}:{lineno}"
    if not isinstance(d, dict):
        return WorkloadError(f"{where}: a Mooncake record is a JSON object with timestamp, input_length, "
                             f"output_length and hash_ids, got {type(d).__name__}")
    for name, conv in (("timestamp", float), ("input_length", _tokens), ("output_length", _output_tokens)):
        if name not in d:
            return WorkloadError(f"{where}: Mooncake record without field {name!r}")
        try:
            ok = math.isfinite(conv(d[name]))
        except (ValueError, TypeError, OverflowError):
            ok = False
        if not ok:
            what = {"timestamp": "a finite number", "input_length": "a whole number of tokens >= 1"}.get(
                name, "a whole number of tokens >= 0")
            return WorkloadError(f"{where}: field {name!r} must be {what}, got {d[name]!r}")
    return WorkloadError(f"{where}: field 'hash_ids' must be a list of integers, got {d.get('hash_ids')!r}")


def load_mooncake(path: str | Path, time_scale: float = 1.0, sample: int | None = None,
                  notes: list[str] | None = None) -> list[SimRequest]:
    """Mooncake JSONL: {timestamp (ms), input_length, output_length, hash_ids}. `notes` receives what
    was done to the recorded times (_sorted)."""
    p = Path(path)
    reqs: list[SimRequest] = []
    cache: dict[tuple[int, ...], tuple[int, ...]] = {}
    lines: list[tuple[int, str]] = []
    try:
        with _open_text(p) as fh:
            if sample is None:
                lines = [(i, line) for i, line in enumerate(fh.read().splitlines(), 1) if line.strip()]
            else:
                for i, line in enumerate(fh, 1):
                    if len(lines) >= sample:
                        break
                    if line.strip():
                        lines.append((i, line))
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"trace file {p} is not UTF-8 text ({exc.reason}); a Mooncake trace is JSON lines, "
                            "plain or gzipped (.gz)") from None
    except _READ_ERRORS as exc:
        raise _unreadable(p, exc) from None
    try:  # one parser call for the whole file; line by line only to say where it is broken
        records = json.loads("[" + ",".join(line for _, line in lines) + "]")
    except ValueError:
        records = None
    for k, (lineno, line) in enumerate(lines):
        try:
            d = records[k] if records is not None else json.loads(line)
        except ValueError as exc:
            raise WorkloadError(f"{p}:{lineno}: not a JSON line ({exc})") from None
        try:
            ts = float(d["timestamp"]) / 1e3
            isl = _tokens(d["input_length"])
            osl = _output_tokens(d["output_length"])
            if not math.isfinite(ts):
                raise ValueError("timestamp")
            hids = d.get("hash_ids") or []
            ids = None
            id_tokens = 0
            if hids:
                if not isinstance(hids, list):
                    raise TypeError("hash_ids")
                key = tuple(hids)
                ids = cache.get(key)
                if ids is None:
                    ids = chain_keys(hids)
                    cache[key] = ids
                id_tokens = min(isl, MOONCAKE_BLOCK * len(hids))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            raise _mooncake_error(d, p, lineno) from None
        reqs.append(SimRequest(len(reqs), ts * time_scale, isl, osl, ids, MOONCAKE_BLOCK, id_tokens))
    return _sorted(reqs, f"{p}", notes)


def _azure_time(text: str) -> float:
    text = text.strip()
    head, _, frac = text.partition(".")
    t = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp()
    return t + (float("0." + frac) if frac else 0.0)


def _azure_error(rec: dict[str, str], p: Path, lineno: int) -> WorkloadError:
    """Why an Azure row could not be read, naming the column (only called once reading it failed)."""
    where = f"{p}:{lineno}"
    try:
        _azure_time(rec["TIMESTAMP"])
    except (ValueError, TypeError, AttributeError):
        return WorkloadError(f"{where}: column TIMESTAMP must look like 2023-11-16 18:15:46.68, "
                             f"got {rec['TIMESTAMP']!r}")
    for name, least in (("ContextTokens", 1), ("GeneratedTokens", 0)):
        try:
            _tokens(rec[name], least)
        except (ValueError, TypeError):
            return WorkloadError(f"{where}: column {name} must be a whole number of tokens >= {least}, "
                                 f"got {rec[name]!r}")
    return WorkloadError(f"{where}: bad Azure record")


def load_azure(path: str | Path, time_scale: float = 1.0, sample: int | None = None,
               notes: list[str] | None = None) -> list[SimRequest]:
    """Azure LLM inference trace CSV: TIMESTAMP, ContextTokens, GeneratedTokens (no prefix ids)."""
    p = Path(path)
    rows: list[tuple[float, int, int]] = []
    with _open_text(p) as fh:
        reader = csv.DictReader(fh)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        try:
            if reader.fieldnames is None or not need <= set(reader.fieldnames):
                raise WorkloadError(f"{p}: an Azure trace needs the columns {', '.join(sorted(need))}")
            for lineno, rec in enumerate(reader, 2):
                if sample is not None and len(rows) >= sample:
                    break
                try:
                    rows.append((_azure_time(rec["TIMESTAMP"]), _tokens(rec["ContextTokens"]),
                                 _output_tokens(rec["GeneratedTokens"])))
                except (ValueError, TypeError, AttributeError):
                    raise _azure_error(rec, p, lineno) from None
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"trace file {p} is not UTF-8 text ({exc.reason}); an Azure trace is CSV, plain or "
                                "gzipped (.gz)") from None
        except csv.Error as exc:
            raise WorkloadError(f"{p}: not a CSV file ({exc})") from None
        except _READ_ERRORS as exc:
            raise _unreadable(p, exc) from None
    if not rows:
        return []
    t0 = min(r[0] for r in rows)
    reqs = [SimRequest(i, (t - t0) * time_scale, isl, osl) for i, (t, isl, osl) in enumerate(rows)]
    return _sorted(reqs, f"{p}", notes)


def _sorted(reqs: list[SimRequest], where: str = "", notes: list[str] | None = None) -> list[SimRequest]:
    """Requests in arrival order, the first at 0. What that changed of the recorded times is said in
    `notes`: a negative timestamp (a clock before the epoch, or a trace cut and re-based by hand) and
    records out of order are read, not refused, but a user should know the replay is not the file."""
    if any(b.arrival < a.arrival for a, b in zip(reqs, reqs[1:], strict=False)):
        reqs.sort(key=lambda r: r.arrival)
        for i, r in enumerate(reqs):
            r.rid = i
        if notes is not None:
            notes.append(f"{where}: records are not in time order; replayed in order of their timestamps")
    if reqs:
        t0 = reqs[0].arrival
        if t0 < 0 and notes is not None:
            negative = sum(1 for r in reqs if r.arrival < 0)
            notes.append(f"{where}: {negative} record(s) have a negative timestamp (the first at {t0:.3f} s); "
                         "arrivals are shifted to start at 0")
        if t0:
            for r in reqs:
                r.arrival -= t0
    return reqs


def load_trace(path: str | Path, fmt: str = "auto", time_scale: float = 1.0,
               sample: int | None = None, notes: list[str] | None = None) -> list[SimRequest]:
    """Requests of a trace file, arrivals from 0, `time_scale` x the recorded times (0.5 = twice
    the rate), only the first `sample` records when given; `notes` receives what the reading
    changed of the recorded times (negative timestamps, records out of order)."""
    if not time_scale > 0:
        raise WorkloadError(f"time_scale must be > 0, got {time_scale}")
    if sample is not None and sample < 1:
        raise WorkloadError(f"sample must be >= 1, got {sample}")
    p = Path(path)
    _check_file(p)
    kind = _fmt(p, fmt)
    if kind not in ("mooncake", "azure"):
        raise WorkloadError(f"unknown trace format {fmt!r}; accepted: mooncake, azure, auto")
    # Reading builds many small objects and no garbage cycles.
    with paused_collector():
        if kind == "mooncake":
            return load_mooncake(p, time_scale, sample, notes)
        return load_azure(p, time_scale, sample, notes)


def trace_driver(tw: TraceWorkload) -> Driver:
    return Driver(load_trace(tw.path, tw.format, tw.time_scale, tw.sample))


# -- synthetic ---------------------------------------------------------------------------------------

SHARED_UNIT = 64  # tokens per prefix unit of a synthetic shared prompt head


def shared_prefix(isl: int, hit_rate: float | None, salt: int) -> tuple[tuple[int, ...] | None, int]:
    """Prefix identity for a request of `isl` random tokens whose first `hit_rate` share is a
    prompt head common to all requests (a system prompt): (ids, id_tokens), or (None, 0) when
    nothing is shared. The rest of the prompt is the request's own (no identity: never cached)."""
    if not hit_rate:
        return None, 0
    shared = int(hit_rate * isl) // SHARED_UNIT * SHARED_UNIT
    if shared <= 0:
        return None, 0
    return chain_keys(range(shared // SHARED_UNIT), salt=salt), shared


def poisson_requests(rate: float, n: int, isl: int, osl: int, seed: int = 0,
                     prefix_hit_rate: float | None = None) -> list[SimRequest]:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=n)
    t = np.cumsum(gaps) - gaps[0]
    ids, tok = shared_prefix(isl, prefix_hit_rate, seed + 1)
    return [SimRequest(i, float(t[i]), isl, osl, ids, SHARED_UNIT, tok) for i in range(n)]


class ClosedLoop(Driver):
    """`concurrency` clients; each sends its next request when the previous one is delivered
    (plus an exponential think time of mean `think_time`), until `n` were sent."""

    closed = True

    def __init__(self, concurrency: int, n: int, isl: int, osl: int, think_time: float = 0.0, seed: int = 0,
                 prefix_hit_rate: float | None = None) -> None:
        super().__init__([])
        self.concurrency, self.n, self.isl, self.osl = int(concurrency), int(n), int(isl), int(osl)
        self.think = float(think_time)
        self.rng = np.random.default_rng(seed)
        self.client_of: list[int] = []
        self.ids, self.id_tokens = shared_prefix(self.isl, prefix_hit_rate, seed + 1)

    def _issue(self, client: int, t: float, submit: Submit) -> None:
        req = SimRequest(len(self.requests), t, self.isl, self.osl, self.ids, SHARED_UNIT, self.id_tokens)
        self.requests.append(req)
        self.client_of.append(client)
        submit(req, t)

    def start(self, submit: Submit) -> None:
        for client in range(min(self.concurrency, self.n)):
            self._issue(client, 0.0, submit)

    def on_finish(self, req: SimRequest, submit: Submit) -> None:
        if len(self.requests) < self.n:
            pause = float(self.rng.exponential(self.think)) if self.think > 0 else 0.0
            t = (req.finish if req.finish is not None else req.arrival) + pause
            self._issue(self.client_of[req.rid], t, submit)

    @property
    def span(self) -> float:
        return 0.0


class MultiTurn(Driver):
    """Sessions arriving as a Poisson process of `rate` per s, each of `turns` turns: the first
    prompt has `isl` tokens, turn k + 1's prompt is turn k's prompt + its answer + `user` new
    tokens, sent an exponential think time (mean `think_time`) after turn k's answer is
    delivered. At most `n` requests in all (the last session may be cut short); a session whose
    turn is refused ends there."""

    closed = True

    def __init__(self, rate: float, turns: int, n: int, isl: int, osl: int, user: int, think_time: float = 0.0,
                 seed: int = 0) -> None:
        super().__init__([])
        self.turns, self.n, self.isl, self.osl, self.user = int(turns), int(n), int(isl), int(osl), int(user)
        self.think = float(think_time)
        self.rng = np.random.default_rng(seed)
        sessions = max(1, math.ceil(self.n / self.turns))
        gaps = self.rng.exponential(1.0 / rate, size=sessions)
        self.starts = (np.cumsum(gaps) - gaps[0]).tolist()
        self.turn_of: list[int] = []
        self.budget = self.n
        self._salt = (seed * 1_000_003 + 7) & 0xFFFFFFFF
        # Each session's unit keys so far: a turn's stream extends the previous turn's, so its
        # keys are the previous ones and a few more (hashed once, not once per turn).
        self._keys: dict[int, list[int]] = {}

    def _request(self, session: int, turn: int, prompt: int, t: float) -> SimRequest:
        total = prompt + self.osl  # the stream this turn leaves in the cache: prompt + answer
        units = -(-total // SESSION_UNIT)
        keys = self._keys.get(session)
        if keys is None:
            keys = self._keys[session] = []
        if len(keys) < units:
            salt = hash((self._salt, session))
            keys.extend(hash((salt, j)) for j in range(len(keys), units))
        ids = tuple(keys[:units])
        req = SimRequest(len(self.requests), t, prompt, self.osl, ids, SESSION_UNIT, total, session=session)
        self.requests.append(req)
        self.turn_of.append(turn)
        return req

    def start(self, submit: Submit) -> None:
        sessions = len(self.starts)
        for s in range(sessions):
            if self.budget <= 0:
                break
            self.budget -= 1
            req = self._request(s, 0, self.isl, self.starts[s])
            submit(req, req.arrival)

    def on_finish(self, req: SimRequest, submit: Submit) -> None:
        turn = self.turn_of[req.rid]
        # A refused turn (the conversation outgrew the model's context or the KV pool) ends its
        # session, as a chat client that gets an error does: the next turn would only be longer.
        if turn + 1 >= self.turns or self.budget <= 0 or req.dropped:
            return
        self.budget -= 1
        pause = float(self.rng.exponential(self.think)) if self.think > 0 else 0.0
        t = (req.finish if req.finish is not None else req.arrival) + pause
        nxt = self._request(req.session, turn + 1, req.prompt + req.output + self.user, t)
        submit(nxt, t)

    @property
    def span(self) -> float:
        return 0.0


def static_driver(w: StaticWorkload, seed: int = 0) -> Driver:
    """The driver of a `StaticWorkload` (the tuning spec's workload shape)."""
    if w.kind == "poisson":
        assert w.request_rate is not None
        return Driver(poisson_requests(w.request_rate, w.num_requests, w.input_tokens, w.output_tokens, seed,
                                       w.prefix_hit_rate))
    if w.kind == "closed":
        assert w.concurrency is not None
        return ClosedLoop(w.concurrency, w.num_requests, w.input_tokens, w.output_tokens, w.think_time_s, seed,
                          w.prefix_hit_rate)
    if w.kind == "multi-turn":
        assert w.sessions_per_second is not None
        return MultiTurn(w.sessions_per_second, w.turns, w.num_requests, w.input_tokens, w.output_tokens,
                         w.user_tokens_per_turn, w.think_time_s, seed)
    raise WorkloadError(f"workload kind {w.kind!r} is not one of poisson, closed, multi-turn")


def driver_for(workload: StaticWorkload | TraceWorkload | Driver | list[SimRequest], seed: int = 0) -> Driver:
    if isinstance(workload, Driver):
        return workload
    if isinstance(workload, list):
        return Driver(workload)
    if isinstance(workload, TraceWorkload):
        return trace_driver(workload)
    if isinstance(workload, StaticWorkload):
        return static_driver(workload, seed)
    raise WorkloadError(f"cannot simulate a workload of type {type(workload).__name__}")
