"""Rendering results for people (aligned tables) and for programs (JSON, YAML)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import yaml

OUTPUT_FORMATS = ("table", "json", "yaml")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and abs(value) >= 100_000:
        return f"{value:,}"  # token counts: 675,712 reads at a glance, 675712 does not
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value == 0:
            return "0"
        mag = abs(value)
        if mag >= 1e12 or mag < 1e-3 or math.isinf(value):
            return f"{value:.3g}"
        if mag >= 100:
            return f"{value:,.0f}"  # 178,000 ms, not 1.78e+05
        return f"{value:.3g}" if mag < 1 else f"{value:.2f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))

    def is_number(c: str) -> bool:
        return c == "-" or c.replace(",", "").replace(".", "").replace("-", "").replace("e", "").replace(
            "+", "").isdigit()

    # A column of figures is right-aligned so digits line up; any text in it makes it left-aligned.
    numeric = [bool(cells) and all(is_number(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if numeric[i] else c.ljust(widths[i]) for i, c in enumerate(row)]
        return "  ".join(out).rstrip()

    lines = []
    if title:
        lines.append(title)
    lines.append(fmt(list(headers)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt(r) for r in cells)
    return "\n".join(lines)


def _plain(obj: Any) -> Any:
    """JSON/YAML-safe copy: tuples to lists, NaN/inf to None, dataclasses via as_dict."""
    if hasattr(obj, "as_dict"):
        return _plain(obj.as_dict())
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def emit(data: Any, fmt: str, text: str | None = None, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    if fmt == "json":
        stream.write(json.dumps(_plain(data), indent=2) + "\n")
    elif fmt == "yaml":
        stream.write(yaml.safe_dump(_plain(data), sort_keys=False))
    else:
        stream.write((text if text is not None else json.dumps(_plain(data), indent=2)) + "\n")
