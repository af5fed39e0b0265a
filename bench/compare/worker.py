"""Runs scenarios in one process of one framework's environment and writes their figures as JSON.

    python worker.py --framework accel --scenarios step,crash --out result.json [--quick] [--arg k=v] [--arg crash.k=v]

Launched by run.py, one process per rank with torchrun's environment variables (run_ranks), or under --quick
forked from the framework's zygote (zygote.py), which calls main() with this argv; process 0 writes `--out`.
A scenario that raises is written as {"error": ...} and the worker exits non-zero.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", required=True)
    parser.add_argument("--scenarios", required=True, help="comma-separated modules of scenarios/")
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--arg", action="append", default=[], help="key=value for every scenario, scenario.key=value for one"
    )
    args = parser.parse_args()
    options = dict(item.split("=", 1) for item in args.arg)
    shared = {k: v for k, v in options.items() if "." not in k}
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch

    torch.set_num_threads(1)
    from frameworks import make

    start = time.perf_counter()
    try:
        harness = make(args.framework, grad_accum=2, strategy=shared.pop("strategy", None))
    except Exception as exc:  # noqa: BLE001 - a framework that refuses the setup: every scenario reports it
        if os.environ.get("RANK", "0") == "0":
            with open(args.out, "w") as f:
                json.dump({name: {"error": f"{type(exc).__name__}: {exc}"} for name in args.scenarios.split(",")}, f)
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    results: dict[str, dict] = {"_setup_s": {"value": time.perf_counter() - start}}
    failed = False
    for name in args.scenarios.split(","):
        module = importlib.import_module(f"scenarios.{name}")
        own = {k.split(".", 1)[1]: v for k, v in options.items() if k.startswith(name + ".")}
        try:
            results[name] = module.run(harness, quick=args.quick, **{**shared, **own})
        except Exception as exc:  # noqa: BLE001 - any failure of a scenario is reported, not hidden
            failed = True
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
            print(results[name]["trace"], file=sys.stderr)
    if harness.rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    sys.stdout.flush()
    os._exit(1 if failed else 0)  # skips interpreter teardown (a framework's atexit) that is no part of the figures


if __name__ == "__main__":
    main()
