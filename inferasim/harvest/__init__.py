"""The anchor harvester (DESIGN.md section 2): drive an engine's OpenAI-compatible endpoint with a
few closed-loop benchmark points, fit the step-time parameters, write the anchor.

`inferasim harvest run --endpoint URL ...` or, from Python, `harvest(HarvestConfig(...))`.
"""

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

__all__ = ["DEFAULT_PLAN_TEXT", "EXIT_FAILED", "EXIT_OK", "EXIT_POOR_FIT", "HarvestConfig", "HarvestError",
           "HarvestReport", "PlanPoint", "PointResult", "RequestResult", "default_plan",
           "harvest", "harvest_async", "parse_plan", "write_anchor"]
