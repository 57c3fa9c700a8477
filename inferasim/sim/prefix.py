"""KV block pool with a prefix cache and an optional host tier, for the trace simulator
(`inferasim.sim.engines`). DESIGN.md section 4.

Prefix identity. A request carries `ids`: chained keys of its token stream in units of `unit`
tokens (key j names tokens [j unit, (j + 1) unit) *and everything before them*, so equal keys mean
an equal prefix, and two chains that differ once differ ever after). Mooncake traces give
512-token units directly (`hash_ids`); multi-turn sessions number the units of their growing
conversation. A request's own stream covers `id_tokens` tokens; its last unit may be partial.

Cache entries are *segments*: a node holds a run of consecutive units of one chain (`keys`),
`cov` tokens from its first unit on (its last unit may be partial), and is indexed by its first
key. A request computing a prompt adds one node (extended chunk by chunk), not one per unit, and
a lookup walks a few nodes: inside a node, the matching length is found by bisection (chained keys
agree up to the point where the chains diverge, and never after). When a request diverges inside
a node, its own continuation is a new node indexed by its key at that point, which the next
request of the same branch finds the same way. This is a radix tree over units with compressed
edges, matched to the token: a hit is min(cached tokens, the request's own tokens) along the
chain, stopping at the first missing unit or a partial one.

The engines' caches differ only in granularity: vLLM V1 and ATOM hash *full* blocks of
`block_size` tokens (a node's `cov` is a multiple of the block size; a hit is rounded down to
whole blocks), SGLang's radix tree is token level (page size 1). Both keep at least one prompt
token to compute. Both evict least recently used unreferenced entries from their tail (vLLM frees
a request's blocks in reverse order into its free queue; the radix tree evicts leaves): the
oldest unreferenced node is trimmed from its end by exactly the blocks needed.

Accounting, in blocks: `used` = blocks held privately by running requests + blocks of every
cached node (referenced or not); `evictable` = blocks of unreferenced nodes. The engines treat
`free = total - used + evictable` as allocatable (vLLM counts cached free blocks as free; SGLang
adds `evictable_size` to its available size) and an allocation evicts when the truly free blocks
do not suffice. KV in use by requests (what the engines report as usage) is `used - evictable`; it
never exceeds `total`.

Host tier (`host_tokens` > 0): evicted tokens are copied to host memory (write-through in the
background: no step time), LRU with its own capacity. A lookup continues into the host tier after
the GPU chain ends on a unit boundary; host hits are loaded back over the host link before the
request's prefill (see `engines.Core._start_host_load`).
"""

from __future__ import annotations

from collections import OrderedDict

from inferasim.errors import InferasimError


class KVPoolFull(InferasimError, RuntimeError):
    """An allocation that the scheduler should have checked first."""


class Node:
    """A cached segment: units `keys` of one chain from stream position `start` (tokens, a unit
    boundary), `cov` tokens of them (the last unit may be partial). The keys are a window of a
    chain tuple, not a copy: src[off:off + nk] (a request's `ids` with off = start // unit, or a
    host segment's keys with off = 0). Trimming a node is nk -= ..., extending it points it at the
    chain of the request that extends it (which holds the node's keys at the same places): copies
    and concatenations of key tuples cost more than the rest of an eviction or a registration."""

    __slots__ = ("key", "src", "off", "nk", "start", "cov", "blocks", "ref", "unit")

    def __init__(self, src: tuple[int, ...], off: int, nk: int, start: int, cov: int, blocks: int,
                 unit: int) -> None:
        self.key = src[off]
        self.src = src
        self.off = off
        self.nk = nk
        self.start = start
        self.cov = cov
        self.blocks = blocks
        self.ref = 0
        self.unit = unit

    @property
    def keys(self) -> tuple[int, ...]:
        return self.src[self.off:self.off + self.nk]


def _common(ids: tuple[int, ...], j: int, keys: tuple[int, ...], off: int, n: int) -> int:
    """Units of keys[off:] that ids[j:] matches, at most n (ids[j] == keys[off] is known; chained
    keys agree on a prefix and never after it, so bisection finds where they part)."""
    if ids[j + n - 1] == keys[off + n - 1]:
        return n
    if ids[j + 1] != keys[off + 1]:
        return 1  # most chains that part inside a node part at once (a shared first unit: a system prompt)
    lo, hi = 2, n  # the first lo units match, the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ids[j + mid - 1] == keys[off + mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


class Match:
    """Result of a lookup: GPU-cached tokens (with the nodes that hold them and the blocks that
    referencing them takes out of the evictable pool), where the request's chain stands in its
    last node (for registration), and host-tier tokens after them."""

    __slots__ = ("gpu", "nodes", "revived", "chain_end", "tail_open", "host", "host_segs", "host_blocks")

    def __init__(self) -> None:
        self.gpu = 0
        self.nodes: list[Node] = []
        self.revived = 0
        self.chain_end = 0  # stream tokens that the referenced nodes hold for this request
        self.tail_open = False  # the last node ends exactly where the chain does (extendable)
        self.host = 0
        self.host_segs: list[tuple[tuple[int, ...], int, int]] = []  # (keys, start, tokens) to load
        self.host_blocks = 0

    @property
    def tokens(self) -> int:
        return self.gpu + self.host


NO_MATCH = Match()


class KVPool:
    """Blocks of one attention-dp rank, with the prefix cache on top."""

    def __init__(self, capacity_tokens: int, block_size: int, caching: bool = True, host_tokens: int = 0,
                 min_compute: int = 1) -> None:
        self.block_size = max(int(block_size), 1)
        self.total = max(int(capacity_tokens), 0) // self.block_size
        self.used = 0
        self.evictable = 0
        self.peak = 0  # of blocks in use by requests (used - evictable)
        self.caching = bool(caching)
        self.min_compute = min_compute  # prompt tokens always computed (the last one)
        self.nodes: dict[int, Node] = {}
        self.lru: OrderedDict[int, Node] = OrderedDict()  # unreferenced nodes, oldest first
        self.host_cap = max(int(host_tokens), 0)
        # key -> (keys, start, cov, unit) of segments evicted to host memory, oldest first
        self.host: OrderedDict[int, tuple[tuple[int, ...], int, int, int]] = OrderedDict()
        self.host_used = 0
        self.epoch = 0  # bumped whenever a lookup could change (insertion, extension, eviction)
        self.evicted_blocks = 0

    # -- sizes -----------------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.total * self.block_size

    @property
    def free(self) -> int:
        return self.total - self.used + self.evictable

    @property
    def in_use(self) -> int:
        return self.used - self.evictable

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _blocks(self, tokens: int) -> int:
        """Blocks of a cached run of tokens (a multiple of the block size for block caches)."""
        b = self.block_size
        return tokens // b if b > 1 else tokens

    # -- allocation ------------------------------------------------------------------------------
    def alloc(self, blocks: int) -> None:
        if blocks <= 0:
            return
        short = blocks - (self.total - self.used)
        if short > 0:
            if short > self.evictable:
                raise KVPoolFull(f"allocate {blocks} blocks with {self.free} free of {self.total}")
            self._evict(short)
        used = self.used = self.used + blocks
        if used - self.evictable > self.peak:
            self.peak = used - self.evictable

    def release(self, blocks: int) -> None:
        self.used -= blocks
        assert self.used >= 0, self.used

    def _evict(self, blocks: int) -> None:
        """Free `blocks` blocks from the least recently used unreferenced nodes, tail first."""
        lru, nodes = self.lru, self.nodes
        b = self.block_size
        host_cap = self.host_cap
        freed = 0
        while freed < blocks:
            # The oldest node is read in place: a node that is only trimmed stays the oldest, and
            # taking it out to put it back first cost more than the rest of an eviction.
            node = next(iter(lru.values()))
            want = blocks - freed
            nb = node.blocks
            if nb <= want:
                key = node.key
                del lru[key]
                del nodes[key]
                freed += nb
                if host_cap:
                    self._to_host(node.keys, node.start, node.cov, node.unit)
                continue
            # Trim the node's tail by `want` blocks.
            unit = node.unit
            cov = node.cov - (want * b if b > 1 else want)
            if host_cap and cov % unit:
                # The host tier indexes whole units and a lookup continues into it only where the
                # GPU chain ends on a unit boundary: the split unit goes to the host whole (less
                # than one unit more evicted), or its tail, and all after it, could never be found.
                cov = cov // unit * unit
                if cov <= 0:
                    key = node.key
                    del lru[key]
                    del nodes[key]
                    freed += nb
                    self._to_host(node.keys, node.start, node.cov, node.unit)
                    continue
                want = nb - self._blocks(cov)
            keep = -(-cov // unit)
            if keep < node.nk:
                if host_cap:
                    # Whole units evicted go to the host; the unit that was split loses its tail.
                    self._to_host(node.keys[keep:], node.start + keep * unit, node.cov - keep * unit, unit)
                node.nk = keep
            node.cov = cov
            node.blocks = nb - want
            freed += want
        self.used -= freed
        self.evictable -= freed
        self.evicted_blocks += freed
        self.epoch += 1

    def _to_host(self, keys: tuple[int, ...], start: int, cov: int, unit: int) -> None:
        if not keys or cov <= 0 or cov > self.host_cap:
            return
        host = self.host
        old = host.pop(keys[0], None)
        if old is not None:
            self.host_used -= old[2]
            if old[2] > cov:
                keys, start, cov, unit = old
        host[keys[0]] = (keys, start, cov, unit)
        self.host_used += cov
        while self.host_used > self.host_cap:
            _, seg = host.popitem(last=False)
            self.host_used -= seg[2]

    # -- lookup ----------------------------------------------------------------------------------
    def match(self, ids: tuple[int, ...] | None, unit: int, id_tokens: int, known: int) -> Match:
        """Cached tokens of a request whose next `known` tokens (prompt + sampled) are to be
        computed: the longest cached prefix, capped so that `min_compute` tokens remain, in whole
        blocks. Nothing is referenced yet (see `take`)."""
        if not self.caching or not ids:
            return NO_MATCH
        b = self.block_size
        limit = known - self.min_compute
        if id_tokens < limit:
            limit = id_tokens
        limit = limit // b * b
        if limit <= 0:
            return NO_MATCH
        nodes = self.nodes
        node = nodes.get(ids[0])
        if node is None:
            if self.host_cap:
                m = Match()
                self._match_host(m, ids, unit, id_tokens, limit, 0)
                return m if m.host else NO_MATCH
            return NO_MATCH
        m = Match()
        m_nodes = m.nodes
        n_ids = len(ids)
        got = 0
        j = 0
        while True:
            src, off, L = node.src, node.off, node.nk
            n = L if L < n_ids - j else n_ids - j
            if ids[j + n - 1] != src[off + n - 1]:  # _common's first two tests, inline (the usual answers)
                n = 1 if ids[j + 1] != src[off + 1] else _common(ids, j, src, off, n)
            node_tok = node.cov if n == L else n * unit
            own = id_tokens - j * unit
            take = node_tok if node_tok < own else own
            if got >= limit:
                break
            m_nodes.append(node)
            if node.ref == 0:
                m.revived += node.blocks
            got += take
            m.chain_end = j * unit + take
            m.tail_open = n == L and take == node_tok
            if take < n * unit:
                break
            j += n
            if got >= limit or j >= n_ids:
                break
            node = nodes.get(ids[j])
            if node is None:
                break
        if got > limit:
            got = limit
        m.gpu = got
        if self.host_cap and got < limit and got == m.chain_end and got % unit == 0 and got // unit < n_ids:
            self._match_host(m, ids, unit, id_tokens, limit, got // unit)
        return m

    def _match_host(self, m: Match, ids: tuple[int, ...], unit: int, id_tokens: int, limit: int, j: int) -> None:
        b = self.block_size
        host = self.host
        n_ids = len(ids)
        got = m.gpu
        h = 0
        while got + h < limit and j < n_ids:
            seg = host.get(ids[j])
            if seg is None:
                break
            keys, _, cov, _ = seg
            L = len(keys)
            n = _common(ids, j, keys, 0, min(L, n_ids - j))
            seg_tok = cov if n == L else n * unit
            take = min(seg_tok, id_tokens - j * unit, limit - got - h)
            take = take // b * b
            if take <= 0:
                break
            m.host_segs.append((keys[: -(-take // unit)], j * unit, take))
            m.host_blocks += self._blocks(take)
            h += take
            if take < n * unit:
                break
            j += n
        m.host = h

    def take(self, nodes: list[Node]) -> None:
        """Reference the nodes of a match (pins them; unreferenced ones leave the LRU)."""
        lru = self.lru
        for node in nodes:
            if node.ref == 0:
                del lru[node.key]
                self.evictable -= node.blocks
                # A cached match counts the blocks it would revive (unreferenced nodes): it is stale.
                self.epoch += 1
            node.ref += 1

    def drop(self, nodes: list[Node]) -> None:
        """Release references, tail first (the tail of a chain is evicted first)."""
        lru = self.lru
        for node in reversed(nodes):
            node.ref -= 1
            if node.ref == 0:
                lru[node.key] = node
                self.evictable += node.blocks
                self.epoch += 1  # as in take: a cached match's revived blocks changed

    def promote(self, segs: list[tuple[tuple[int, ...], int, int]], unit: int) -> list[Node]:
        """Bring host-tier segments back into GPU blocks (allocated here), referenced once."""
        out = []
        for keys, start, tokens in segs:
            node = self.nodes.get(keys[0])
            if node is not None:  # cached again meanwhile
                self.take([node])
                out.append(node)
                continue
            blocks = self._blocks(tokens)
            self.alloc(blocks)
            node = Node(keys, 0, len(keys), start, tokens, blocks, unit)
            node.ref = 1
            self.nodes[keys[0]] = node
            out.append(node)
            if keys[0] in self.host:
                self.host.move_to_end(keys[0])
        self.epoch += 1
        return out

    # -- insertion -------------------------------------------------------------------------------
    def register(self, row, comp: int) -> int:  # noqa: ANN001 - engines.Row (import cycle)
        """Turn the row's computed private blocks into cache, up to `comp` tokens of its prefix
        stream (whole blocks for block caches): extend the node its chain ends in when that node
        ends where the chain does, else add a node. Returns the blocks converted: they move from
        the row's private blocks to its shared ones (`used` does not change)."""
        req = row.req
        upto = req.id_tokens
        if comp < upto:
            upto = comp
        b = self.block_size
        if b > 1:
            upto = upto // b * b
        start = row.reg_tok
        if upto <= start or row.reg_stop:
            return 0
        unit = req.unit
        ids = req.ids
        nodes = self.nodes
        added = 0
        if row.tail_open:
            tail = row.nodes[-1]
            t0, cov = tail.start, tail.cov
            if t0 + cov != start:
                row.reg_stop = True  # extended by another request meanwhile
                return 0
            u0 = t0 // unit
            u_have = u0 + tail.nk
            edge = u_have * unit
            stop = upto
            if upto > edge:
                if ids[u_have] in nodes:
                    stop = edge  # someone else's copy of what follows: ours stays private
                    row.reg_stop = True
                else:
                    # This chain holds the node's keys at the same places (it reached the node's end).
                    tail.src, tail.off, tail.nk = ids, u0, -(-upto // unit) - u0
            if stop > start:
                cov += stop - start
                added = (cov // b if b > 1 else cov) - tail.blocks  # self._blocks(cov), inline (hot)
                tail.cov = cov
                tail.blocks += added
                row.reg_tok = stop
        else:
            if start % unit:
                return 0  # the chain left a cached node inside a unit: nothing of ours to add
            u0 = start // unit
            key = ids[u0]
            if key in nodes:
                row.reg_stop = True
                return 0
            added = (upto - start) // b if b > 1 else upto - start  # self._blocks
            node = Node(ids, u0, -(-upto // unit) - u0, start, upto - start, added, unit)
            node.ref = 1
            nodes[key] = node
            row.nodes.append(node)
            row.tail_open = True
            row.reg_tok = upto
        if added:
            row.shared += added
        self.epoch += 1
        return added
