"""What the engine schedulers (:mod:`inferasim.sim.engines`) move around: a request and
its timings (:class:`SimRequest`), its row in a rank while it is admitted (:class:`Row`), and the
work of one step (:class:`Batch`).
"""

from __future__ import annotations

from inferasim.sim.prefix import NO_MATCH, Match, Node


class SimRequest:
    """One request of the trace simulator and what its client saw (times in s).

    `ids`/`unit`/`id_tokens`: the prefix identity (chained unit keys covering the first
    `id_tokens` tokens of the request's stream: its prompt, and for multi-turn sessions its
    answer too). `prebuilt`: its KV (prompt and first token) comes from a prefill worker and takes
    `load_s` to transfer once the decode worker has allocated it."""

    __slots__ = ("rid", "arrival", "prompt", "output", "ids", "unit", "id_tokens", "rank", "replica",
                 "first_token", "finish", "generated", "preemptions", "prefix_hit", "host_hit", "dropped",
                 "prebuilt", "load_s", "t_last", "max_gap", "parent", "session", "pinned",
                 "_m_epoch", "_m_known", "_m")

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, ids: tuple[int, ...] | None = None,
                 unit: int = 512, id_tokens: int | None = None, session: int = -1, rank: int = 0) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = int(prompt)
        self.output = int(output)
        self.ids = ids
        self.unit = int(unit)
        self.id_tokens = int(id_tokens) if id_tokens is not None else (len(ids) * self.unit if ids else 0)
        self.rank = rank  # attention-dp rank (the trace simulator's router sets it)
        self.replica = -1
        self.first_token: float | None = None
        self.finish: float | None = None
        self.generated = 0
        self.preemptions = 0
        self.prefix_hit = -1  # prompt tokens found cached at its first admission (-1: not admitted)
        self.host_hit = 0
        self.dropped: str | None = None
        self.prebuilt = False
        self.load_s = 0.0
        self.t_last: float | None = None  # engine time of its last token
        self.max_gap = 0.0  # largest inter-token gap recorded one by one (see report for the rest)
        self.parent: SimRequest | None = None
        self.session = session
        self.pinned: list[Node] | None = None
        self._m_epoch = -1
        self._m_known = -1
        self._m: Match = NO_MATCH

    @property
    def ttft(self) -> float:
        assert self.first_token is not None
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        assert self.finish is not None
        return self.finish - self.arrival

    @property
    def tpot(self) -> float:
        assert self.first_token is not None and self.finish is not None
        return (self.finish - self.first_token) / max(self.output - 1, 1)

    def __repr__(self) -> str:
        return (f"SimRequest(rid={self.rid}, arrival={self.arrival:.3f}, prompt={self.prompt}, "
                f"output={self.output}, first_token={self.first_token}, finish={self.finish}, "
                f"dropped={self.dropped!r})")


class Row:
    """A request holding KV on a rank. While it decodes, `comp`/`gen` are `cb`/`gb` + G."""

    __slots__ = ("req", "prompt", "out", "seq", "comp", "gen", "cb", "gb", "fin", "jt", "shared", "upto",
                 "nodes", "reg_tok", "tail_open", "reg_stop", "in_d", "alive", "served", "i0", "over_t", "over_tok")

    def __init__(self, req: SimRequest, seq: int, comp: int, gen: int, shared: int, nodes: list[Node],
                 upto: int = 0) -> None:
        self.req = req
        self.prompt = req.prompt
        self.out = req.output
        self.seq = seq
        self.comp = comp
        self.gen = gen
        self.cb = 0
        self.gb = 0
        self.fin = 0
        self.jt = 0
        self.shared = shared  # blocks of its table that are cache nodes (the rest are private)
        self.upto = upto  # tokens whose blocks were allocated ahead of computing them (ATOM)
        self.nodes = nodes
        self.reg_tok = 0  # stream tokens already in cache nodes it references
        self.tail_open = False  # its last node ends where its chain does (it may extend it)
        self.reg_stop = False
        self.in_d = False
        self.alive = True
        self.served = 0
        self.i0 = 0
        self.over_t = 0
        self.over_tok = 0


class Batch:
    __slots__ = ("n_dec", "ctx_dec", "pre", "n_pref", "ctx_pref", "seq_pref")

    def __init__(self, n_dec: int, ctx_dec: float, pre: list[tuple[Row, int, int]]) -> None:
        self.n_dec = n_dec
        self.ctx_dec = ctx_dec
        self.pre = pre
        if pre:
            # Token-weighted mean context of a prefill token: a chunk of L tokens from position s
            # sees s + L/2 on average (the closed form's isl/2 for a whole prompt).
            tot = 0
            acc = 0.0
            longest = 0
            for _, n, s in pre:
                tot += n
                acc += n * (s + n / 2.0)
                if s + n > longest:
                    longest = s + n
            self.n_pref = tot
            self.ctx_pref = acc / tot if tot else 0.0
            self.seq_pref: float | None = float(longest)  # decides a DSA model's sparse prefill
        else:
            self.n_pref = 0
            self.ctx_pref = 0.0
            self.seq_pref = None

    @property
    def empty(self) -> bool:
        return not self.n_dec and not self.pre


EMPTY = Batch(0, 0.0, [])
