"""How one replica of a model is split over GPUs.

`tp` tensor-parallel width of attention and dense layers, `pp` pipeline stages, `dp` attention
data-parallel ranks (SGLang `--enable-dp-attention`, vLLM `--data-parallel-size` with expert
parallel), `moe_tp` x `moe_ep` the split of routed experts (tensor slices x expert shards; their
product equals tp x dp). GPUs per replica = tp x pp x dp, the convention of the public data and
of DESIGN.md section 7.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from inferasim.errors import UserError


class LayoutError(UserError):
    """A layout that cannot exist; the message names the field."""


@dataclass(frozen=True, order=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    moe_tp: int = 0  # 0 = derived: tp x dp / moe_ep
    moe_ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "moe_ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"layout field {name}={v!r} must be a positive integer")
        if self.moe_tp < 0:
            raise LayoutError(f"layout field moe_tp={self.moe_tp!r} must be >= 0 (0 = derived)")
        if self.moe_tp == 0:
            width = self.tp * self.dp
            if width % self.moe_ep:
                raise LayoutError(
                    f"moe_ep={self.moe_ep} must divide tp x dp = {width}; choose moe_ep among "
                    f"{[d for d in range(1, width + 1) if width % d == 0]}"
                )
            object.__setattr__(self, "moe_tp", width // self.moe_ep)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def moe_width(self) -> int:
        """GPUs one MoE layer's experts are spread over."""
        return self.moe_tp * self.moe_ep

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.dp > 1:
            parts.append(f"dp{self.dp}")
        if self.moe_ep > 1:
            parts.append(f"ep{self.moe_ep}")
        return "-".join(parts)
