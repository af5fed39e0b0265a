"""Leaves what a normal interpreter exit finishes: a buffered file never closed, a non-daemon thread
still writing, an atexit handler, unflushed stdout. The runner must finish all of it."""

import atexit
import sys
import threading
import time

out = sys.argv[1]
left_open = open(f"{out}/left_open.txt", "w")  # noqa: SIM115 - never closed on purpose
left_open.write("buffered, never closed")


def late_writer() -> None:
    time.sleep(0.5)
    with open(f"{out}/thread.txt", "w") as handle:
        handle.write("thread finished")


threading.Thread(target=late_writer).start()
atexit.register(lambda: open(f"{out}/atexit.txt", "w").write("atexit ran"))  # noqa: SIM115 - closed at exit too
sys.stdout.write("no newline, not flushed")
