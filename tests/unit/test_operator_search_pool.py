"""The bounded search pool (operator/inferasim_operator/search_pool.py) with real worker processes
and the real `tune`: fair order, identical searches once, backoff after a timeout, places
reported, and workers that die with the operator."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from inferasim_operator import search_pool
from inferasim_operator.search import SearchTimeout, worker_main
from inferasim_operator.search_pool import SearchPool, default_workers, search_key
from inferasim_operator.spec_rules import parse_tuning_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = {"target": {"name": "chat"}, "model": "meta-llama/Meta-Llama-3-8B", "precision": ["bf16"],
        "hardware": {"gpu": "MI300X", "maxGPUs": 2}, "engines": ["vllm"],
        "workload": {"static": {"kind": "poisson", "requestRate": 2, "inputTokens": 256, "outputTokens": 64}}}


def spec_dict(**over: Any) -> dict[str, Any]:
    return {**parse_tuning_spec({**SPEC, **over}).model_dump(by_alias=True, mode="json", exclude_none=True)}


def test_default_size_is_the_cpus_we_may_use() -> None:
    assert 1 <= default_workers() <= (os.cpu_count() or 1)


def test_fair_order_round_robin_across_namespaces() -> None:
    async def main() -> list[str]:
        pool = SearchPool(worker_main, 1)
        loop = asyncio.get_running_loop()
        for tenant, n in (("big", 4), ("small", 1), ("other", 2)):
            for i in range(n):
                req = search_pool._Request("search", f"{tenant}{i}", tenant, (), (), 1.0, loop.create_future())
                pool._waiting.setdefault(tenant, search_pool.collections.deque()).append(req)
                if tenant not in pool._turn:
                    pool._turn.append(tenant)
        order = [r.key for r in pool._order()]
        popped = []
        while (r := pool._pop()) is not None:
            popped.append(r.key)
        assert popped == order
        return order

    # One namespace with many tunings does not starve the others: they are served in turn.
    assert asyncio.run(main()) == ["big0", "small0", "other0", "big1", "other1", "big2", "big3"]


def test_identical_searches_run_once_and_places_are_reported(tmp_path: Path) -> None:
    reports: dict[str, list[tuple[int, int, int]]] = {}

    async def main() -> list[dict[str, Any]]:
        pool = SearchPool(worker_main, 1, report_every_s=0.2)
        try:
            async def one(name: str, spec: dict[str, Any]) -> dict[str, Any]:
                async def report(place: int, waiting: int, workers: int) -> None:
                    reports.setdefault(name, []).append((place, waiting, workers))

                key = search_key(spec, 2, [])
                return await pool.search(key=key, tenant="ns", search_args=(spec, [str(tmp_path)], 2),
                                         render_args=(name, "ns", None, name), timeout_s=240, report=report)

            same = spec_dict()
            other = spec_dict(workload={"static": {"kind": "poisson", "requestRate": 3, "inputTokens": 256,
                                                   "outputTokens": 64}})
            tasks = [asyncio.create_task(one("a", same))]
            await asyncio.sleep(0.05)
            tasks += [asyncio.create_task(one("x", other))]
            await asyncio.sleep(0.05)
            tasks += [asyncio.create_task(one(n, same)) for n in ("b", "c")]
            out = await asyncio.gather(*tasks)
            assert pool.stats["searched"] == 2 and pool.stats["coalesced"] == 2, pool.stats
            return out
        finally:
            pool.close()

    a, x, b, c = asyncio.run(main())
    # Each tuning gets its own names rendered from the one search.
    assert a["recommendation"] == b["recommendation"] == c["recommendation"]
    assert "name: b\n" in b["manifest"] and "name: c\n" in c["manifest"] and "name: a\n" not in b["manifest"]
    assert [d["metadata"]["name"] for d in b["shortlist_deployments"] if "metadata" in d][0] == "b-canary-0"
    assert [d["metadata"]["name"] for d in c["shortlist_deployments"] if "metadata" in d][0] == "c-canary-0"
    assert x["workload"] != a["workload"]
    # x waited behind a (one worker): Queued at place 1, then running (0).
    assert reports["x"][0][0] == 1 and reports["x"][0][2] == 1 and reports["x"][-1][0] == 0
    assert reports["a"][-1][0] == 0


def test_a_timed_out_search_backs_off_and_is_not_rerun(tmp_path: Path) -> None:
    async def main() -> tuple[float, float, SearchPool]:
        pool = SearchPool(worker_main, 1, backoff_base_s=60)
        big = {**spec_dict(), "engines": ["vllm", "sglang"], "hardware": {"gpu": "MI300X", "maxGPUs": 64,
                                                                         "gpusPerNode": 8}}
        key = search_key(big, 50, [])
        args = dict(key=key, tenant="ns", search_args=(big, [str(REPO / "anchors")], 50),
                    render_args=("chat", "ns", None, "chat"), timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(SearchTimeout) as first:
            await pool.search(**args)  # type: ignore[arg-type]
        t1 = time.monotonic()
        with pytest.raises(SearchTimeout) as second:
            await pool.search(**args)  # type: ignore[arg-type]
        t2 = time.monotonic()
        assert first.value.retry_in == pytest.approx(60, abs=1)
        assert "not run again" in str(second.value) and second.value.retry_in > 55
        pool.close()
        return t1 - t0, t2 - t1, pool

    took, again, pool = asyncio.run(main())
    assert took < 20 and again < 0.1
    assert pool.stats["timeouts"] == 1 and pool.stats["timeout_backoff"] == 1


def test_workers_die_with_the_operator(tmp_path: Path) -> None:
    """kill -9 of the process that owns the pool: its search worker ends too (it used to setsid)."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, os, sys
        sys.path.insert(0, {str(REPO / "operator")!r})
        from inferasim_operator.search import worker_main
        from inferasim_operator.search_pool import SearchPool, search_key

        async def main():
            pool = SearchPool(worker_main, 1)
            spec = {spec_dict(engines=["vllm", "sglang"])!r}
            spec["hardware"] = {{"gpu": "MI300X", "maxGPUs": 64, "gpusPerNode": 8}}
            args = (spec, [{str(REPO / 'anchors')!r}], 200)
            task = asyncio.create_task(pool.search(key="k", tenant="t", search_args=args,
                                                   render_args=("c", "n", None, "c"), timeout_s=600))
            while pool._workers[0] is None or not pool._workers[0].proc.pid:
                await asyncio.sleep(0.05)
            print(pool._workers[0].proc.pid, flush=True)
            await task

        if __name__ == "__main__":
            asyncio.run(main())
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(owner.stdout.readline())  # type: ignore[union-attr]
        time.sleep(1.0)
        os.kill(worker, 0)  # alive, searching
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                break
            try:  # a zombie until its new parent reaps it: dead all the same
                if Path(f"/proc/{worker}/stat").read_text().split(") ")[1].startswith("Z"):
                    break
            except OSError:
                break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            pytest.fail("the search worker outlived the operator")
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_burst_runs_quick_searches_and_background_ones_wait(tmp_path: Path) -> None:
    """Under a burst a search runs a smaller stage 2 (quick); a background refinement starts only
    when no other search waits, and is never shortened."""
    order: list[str] = []

    async def main() -> dict[str, dict[str, Any]]:
        pool = SearchPool(worker_main, 1, burst_stage2_top=1, burst_queue=2)
        try:
            async def one(name: str, rate: float, background: bool = False) -> tuple[str, dict[str, Any]]:
                spec = spec_dict(workload={"static": {"kind": "poisson", "requestRate": rate, "inputTokens": 256,
                                                      "outputTokens": 64}})

                async def report(place: int, waiting: int, workers: int) -> None:
                    if place == 0:
                        order.append(name)

                key = search_key(spec, 3, [])
                out = await pool.search(key=key, tenant="ns", search_args=(spec, [str(tmp_path)], 3),
                                        render_args=(name, "ns", None, name), timeout_s=240, report=report,
                                        background=background)
                return name, out

            tasks = [asyncio.create_task(one("n0", 1.0))]
            await asyncio.sleep(0.3)  # n0 runs
            tasks += [asyncio.create_task(one("bg", 9.0, background=True))]
            await asyncio.sleep(0.05)
            tasks += [asyncio.create_task(one(f"n{i}", 1.0 + i)) for i in (1, 2)]
            return dict(await asyncio.gather(*tasks))
        finally:
            pool.close()

    out = asyncio.run(main())
    # The background search was asked for before n1 and n2, and ran after them, in full.
    assert order == ["n0", "n1", "n2", "bg"], order
    assert out["bg"]["quick"] is False and out["bg"]["stage2_top"] == 3
    # n1 started while n2 waited (a burst for this pool): shortened; n0 and n2 ran alone: in full.
    assert out["n1"]["quick"] is True and out["n1"]["stage2_top"] == 1
    assert [out[n]["quick"] for n in ("n0", "n2")] == [False, False]
