"""The anchor harvester (DESIGN.md section 2): drive an engine's OpenAI-compatible endpoint with a
few closed-loop benchmark points, fit the step-time parameters, write the anchor.

`inferasim harvest run --endpoint URL ...` or, from Python, `harvest(HarvestConfig(...))`.

The names below are imported when first used (PEP 562): `inferasim.harvest.plan`, which the
search reads for harvest costs, is then imported without the HTTP client (httpx) and the runner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferasim.harvest.client import HarvestError, PointResult, RequestResult
    from inferasim.harvest.plan import DEFAULT_PLAN_TEXT, PlanPoint, default_plan, parse_plan
    from inferasim.harvest.run import (
        EXIT_FAILED,
        EXIT_OK,
        EXIT_POOR_FIT,
        HarvestConfig,
        HarvestReport,
        harvest,
        harvest_async,
        write_anchor,
    )

_WHERE = {
    "HarvestError": "client", "PointResult": "client", "RequestResult": "client",
    "DEFAULT_PLAN_TEXT": "plan", "PlanPoint": "plan", "default_plan": "plan", "parse_plan": "plan",
    "EXIT_FAILED": "run", "EXIT_OK": "run", "EXIT_POOR_FIT": "run", "HarvestConfig": "run", "HarvestReport": "run",
    "harvest": "run", "harvest_async": "run", "write_anchor": "run",
}

__all__ = ["DEFAULT_PLAN_TEXT", "EXIT_FAILED", "EXIT_OK", "EXIT_POOR_FIT", "HarvestConfig", "HarvestError",
           "HarvestReport", "PlanPoint", "PointResult", "RequestResult", "default_plan",
           "harvest", "harvest_async", "parse_plan", "write_anchor"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'inferasim.harvest' has no attribute {name!r}")
    return getattr(importlib.import_module(f"inferasim.harvest.{where}"), name)
