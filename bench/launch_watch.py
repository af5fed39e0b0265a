"""CPU the launcher's exit watch (``accel_launch.exit_watch.ChildExitWatch``) costs while workers run.

`accel launch` watches each worker's ``/proc/<pid>/stat`` every few milliseconds to time a worker's death for
the first-failure report; that thread shares the cores with the workers. This prints the launcher process's
CPU seconds over a fixed wall time with two sleeping children, watched and not watched (the difference is the
watch's cost; raw torchrun's agent has no such watch).

    uv run python bench/launch_watch.py [--seconds 10] [--period 0.005]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import time

from accel_launch.exit_watch import ChildExitWatch


def cpu_seconds_over(seconds: float, watch: ChildExitWatch | None) -> float:
    children = [subprocess.Popen(["sleep", str(seconds + 5)]) for _ in range(2)]
    try:
        before = os.times()
        with watch if watch is not None else contextlib.nullcontext():
            time.sleep(seconds)
        after = os.times()
    finally:
        for child in children:
            child.kill()
            child.wait()
    if watch is not None:
        assert set(watch.alive_at) == {child.pid for child in children}, "the watch did not see both children"
    return (after.user - before.user) + (after.system - before.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--period", type=float, default=None, help="force the fallback poll (no pidfds) at this period, in seconds"
    )
    args = parser.parse_args()
    idle = cpu_seconds_over(args.seconds, None)
    watch = ChildExitWatch() if args.period is None else ChildExitWatch(period=args.period, use_pidfds=False)
    watched = cpu_seconds_over(args.seconds, watch)
    way = "pidfds and failure announcements" if args.period is None else f"a poll every {args.period * 1000:.0f} ms"
    cost = watched - idle
    print(f"launcher CPU over {args.seconds:.0f} s: not watched {idle:.3f} s, watched {watched:.3f} s")
    print(f"the watch ({way}, 2 children): {100 * cost / args.seconds:.2f}% of a core")


if __name__ == "__main__":
    main()
