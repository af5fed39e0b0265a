"""Two ranks, no torch: rank 1 raises; rank 0 would sleep a minute unless the launcher stops it."""

import os
import time


def explode() -> None:
    raise ValueError("rank one is broken")


if os.environ["RANK"] == "1":
    time.sleep(0.5)
    explode()
time.sleep(60)
print("rank 0 was not stopped", flush=True)
