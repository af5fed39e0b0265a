"""What the tables of other launchers' flags share (``accelerate_flags``, ``torchrun_flags``): their outcomes and how
a flag is added to ``accel launch``'s parser, hidden from ``--help``. Pure and without torch."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

NOT_NEEDED = "not needed"  # accel does the same without it: accepted, with a one-line note
REFUSED = "refused"  # accel cannot do what it asks: the launch stops before anything starts, saying what to do


def add_hidden_flag(parser: argparse.ArgumentParser, names: Sequence[str], dest: str, takes_value: bool) -> None:
    """Adds the spellings in ``names`` that ``parser`` does not have yet, hidden from ``--help``; a switch
    (``takes_value=False``) stores ``"true"``, a flag with a value stores its text, and an absent one ``None``."""
    free = [name for name in names if name not in parser._option_string_actions]
    if not free:
        return
    kwargs: dict[str, Any] = {"dest": dest, "default": None, "help": argparse.SUPPRESS}
    if takes_value:
        kwargs["metavar"] = "VALUE"
    else:
        kwargs.update(action="store_const", const="true")
    parser.add_argument(*free, **kwargs)
