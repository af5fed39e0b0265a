"""No torch: what a torchrun launch line gave this worker (its rank variables and rendezvous port), as one JSON line."""

import json
import os
import sys

names = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
# One write per line: workers share the terminal, and `python -u` would write print's newline separately.
sys.stdout.write("RANKS " + json.dumps({name: os.environ.get(name) for name in names}) + "\n")
