"""No torch: writes this worker's pid to <argv[1]><RANK> and sleeps until someone stops it."""

import os
import sys
import time
from pathlib import Path

Path(sys.argv[1] + os.environ.get("RANK", "0")).write_text(str(os.getpid()))
time.sleep(300)
