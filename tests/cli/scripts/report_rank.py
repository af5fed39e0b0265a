"""No torch: prints the rank variables torchrun gave this worker, as JSON on one line."""

import json
import os
import sys

names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ACCEL_USE_CPU")
# One write per line: workers share the terminal, and `python -u` would write print's newline separately.
sys.stdout.write("RANKS " + json.dumps({name: os.environ.get(name) for name in names}) + "\n")
