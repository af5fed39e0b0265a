"""One process, no torch: reports what `accel launch` gave it, then exits with the code it was asked for."""

import json
import os
import sys

report = {
    "argv": sys.argv[1:],
    "path0": sys.path[0],
    "name": __name__,
    "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "ACCEL_MIXED_PRECISION", "ACCEL_USE_CPU", "EXTRA")},
}
print(json.dumps(report), flush=True)
sys.exit(int(sys.argv[1]))
