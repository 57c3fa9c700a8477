"""The KV block pool of one attention-dp rank (DESIGN.md section 4).

Only block *counts* are kept: without prefix caching two requests never share a block, so which
physical block a request holds does not change any step time. A later prefix cache (vLLM hashed
full blocks with LRU eviction, SGLang radix tree) extends this class with a block table; the
schedulers only use `blocks_for`, `blocks_needed`, `allocate`, `free` and `decode_profile`.

Capacity is `EngineSched.kv_tokens x StepParams.kv_scale` tokens rounded down to whole blocks: the
fitted multiplier is what the analytic estimator uses too, so both see the same pool.
"""

from __future__ import annotations

import numpy as np

from inferasim.errors import InferasimError


class KVCacheFull(InferasimError, RuntimeError):
    """An allocation the scheduler should have checked first."""


class KVCache:
    """Block pool with a high-water mark, never allocated past its capacity."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.block_size = max(int(block_size), 1)
        self.total_blocks = max(int(capacity_tokens), 0) // self.block_size
        self.used_blocks = 0
        self.peak_blocks = 0

    # -- sizes -----------------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.total_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks

    @property
    def peak_tokens(self) -> int:
        return self.peak_blocks * self.block_size

    def blocks_for(self, tokens: int | np.ndarray) -> int | np.ndarray:
        """Blocks that hold `tokens` tokens (ceil division; vectorised)."""
        return -(-tokens // self.block_size)

    def blocks_needed(self, held_tokens: int | np.ndarray, new_tokens: int | np.ndarray) -> int | np.ndarray:
        """Extra blocks a request holding `held_tokens` needs to write `new_tokens` more."""
        return self.blocks_for(held_tokens + new_tokens) - self.blocks_for(held_tokens)

    # -- allocation ------------------------------------------------------------------------------
    def can_allocate(self, blocks: int) -> bool:
        return blocks <= self.free_blocks

    def allocate(self, blocks: int) -> None:
        blocks = int(blocks)
        if blocks > self.free_blocks:
            raise KVCacheFull(f"allocate {blocks} blocks with {self.free_blocks} free of {self.total_blocks}")
        self.used_blocks += blocks
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks

    def free(self, blocks: int) -> None:
        blocks = int(blocks)
        assert 0 <= blocks <= self.used_blocks, (blocks, self.used_blocks)
        self.used_blocks -= blocks

    # -- closed form for runs of decode steps ----------------------------------------------------
    def decode_profile(self, held_tokens: np.ndarray) -> DecodeBlocks:
        return DecodeBlocks(held_tokens, self.block_size)

    def decode_blocks(self, held_tokens: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Cumulative new blocks after each of `steps` decode steps (see DecodeBlocks)."""
        return self.decode_profile(held_tokens).after(np.asarray(steps, dtype=np.int64))


class DecodeBlocks:
    """Cumulative new blocks that a fixed set of decoding sequences needs after j steps (one
    token per sequence per step).

    Why closed form: a sequence holding n tokens needs a block at step j iff n + j - 1 is a
    multiple of B, i.e. first at step o = (-n mod B) + 1 and then every B steps. With
    j = qB + r (0 <= r < B) that is q + [o <= r] blocks, so the total is N q + H[r] with H the
    cumulative histogram of the offsets: O(N) once, then O(1) per j instead of O(N)."""

    def __init__(self, held_tokens: np.ndarray, block_size: int) -> None:
        self.n = int(held_tokens.size)
        self.b = block_size
        self._cum: np.ndarray | None = None
        if block_size > 1:
            offsets = (-held_tokens) % block_size + 1  # in 1..B
            self._cum = np.cumsum(np.bincount(offsets, minlength=block_size + 1))

    def at(self, j: int) -> int:
        if self._cum is None:
            return self.n * j
        q, r = divmod(j, self.b)
        return self.n * q + int(self._cum[r])

    def after(self, steps: np.ndarray) -> np.ndarray:
        if self._cum is None:
            return self.n * steps
        q, r = np.divmod(steps, self.b)
        return self.n * q + self._cum[r]

    def upto(self, k: int) -> np.ndarray:
        """Cumulative blocks after 1, 2, ..., k steps."""
        return self.after(np.arange(1, k + 1, dtype=np.int64))
