"""No torch: prints the rank variables torchrun gave this worker, as JSON on one line."""

import json
import os
import sys

names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ACCEL_USE_CPU")
report = {name: os.environ.get(name) for name in names}
report.update(file=__file__, argv0=sys.argv[0], path0=sys.path[0])  # what `python report_rank.py` would give
# One write per line: workers share the terminal, and `python -u` would write print's newline separately.
sys.stdout.write("RANKS " + json.dumps(report) + "\n")
