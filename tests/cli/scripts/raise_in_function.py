"""Raises from a nested function, to check the traceback the launcher reports."""

import sys


def explode(message: str) -> None:
    raise ValueError(message)


explode(" ".join(sys.argv[1:]) or "boom")
