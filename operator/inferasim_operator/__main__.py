"""`python -m inferasim_operator`: run the operator (kopf) with structured logs and a liveness probe.

    python -m inferasim_operator [--namespace NS ...] [--liveness URL] [--log-format json|plain]

Without --namespace it watches the whole cluster. Settings: INFERASIM_* environment variables
(see inferasim_operator.settings).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inferasim_operator", description=__doc__.splitlines()[0])
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable); default: all namespaces")
    p.add_argument("--liveness", default=os.environ.get("INFERASIM_LIVENESS", "http://0.0.0.0:8081/healthz"),
                   help="liveness/readiness endpoint (empty: none)")
    p.add_argument("--log-format", choices=["json", "plain", "full"],
                   default=os.environ.get("INFERASIM_LOG_FORMAT", "json"))
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)

    import kopf

    # Importing registers the handlers (and validates INFERASIM_* settings: a bad value stops here).
    try:
        import inferasim_operator.handlers  # noqa: F401
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()], log_refkey="object")
    # One line per Prometheus query is noise at INFO; failures are reported as conditions and events.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    kopf.run(standalone=True, clusterwide=not args.namespace, namespaces=args.namespace,
             liveness_endpoint=args.liveness or None)
    return 0


if __name__ == "__main__":  # spawned search processes import this module too: run only as main
    sys.exit(main())
