"""The harvester container of a harvest Job's pod (`python -m inferasim_operator.harvest_pod`).

    python -m inferasim_operator.harvest_pod --endpoint URL --done-file F --anchor-file A -- HARVEST-ARGS...

1. waits until the engine beside it answers `/health` (bounded by --ready-timeout-s);
2. runs `inferasim harvest run HARVEST-ARGS` (which writes the anchor to --anchor-file);
3. writes the anchor, gzip + base64, into the termination message, where the operator reads it;
4. always creates --done-file, which tells the engine container to stop, so that the Job ends.

Exit code: the harvester's (0 anchor written), 1 when the engine never became ready or the anchor
cannot be encoded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inferasim.model.anchors import load_anchor
from inferasim_operator.harvest_job import MessageError, encode_anchor


def wait_ready(endpoint: str, timeout_s: float, sleep_s: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(endpoint.rstrip("/") + "/health", timeout=5.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(sleep_s)
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inferasim_operator.harvest_pod", description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--done-file", required=True, type=Path)
    p.add_argument("--anchor-file", required=True, type=Path)
    p.add_argument("--termination-log", type=Path,
                   default=Path(os.environ.get("INFERASIM_TERMINATION_LOG", "/dev/termination-log")))
    p.add_argument("--ready-timeout-s", type=float, default=900.0)
    p.add_argument("harvest", nargs=argparse.REMAINDER, help="arguments of `inferasim harvest run` (after --)")
    args = p.parse_args(argv)
    harvest = [a for a in args.harvest if a != "--"] if args.harvest[:1] == ["--"] else args.harvest
    message = ""
    try:
        if not wait_ready(args.endpoint, args.ready_timeout_s):
            message = f"the engine at {args.endpoint} was not ready within {args.ready_timeout_s:.0f} s"
            return 1
        rc = subprocess.call([sys.executable, "-m", "inferasim.harvest", "run", *harvest])
        if rc != 0:
            message = f"inferasim harvest run exited with {rc}"
            return rc
        try:
            message = encode_anchor(load_anchor(args.anchor_file))
        except (MessageError, ValueError) as exc:
            message = f"harvested, but: {exc}"
            return 1
        return 0
    finally:
        try:
            args.termination_log.write_text(message)
        except OSError as exc:
            print(f"harvest_pod: cannot write {args.termination_log}: {exc}", file=sys.stderr)
        args.done_file.parent.mkdir(parents=True, exist_ok=True)
        args.done_file.touch()


if __name__ == "__main__":
    sys.exit(main())
