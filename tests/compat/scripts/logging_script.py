"""get_logger as an Accelerate user calls it (only the import changed); run under torchrun with 2 processes.

Prints what each check saw; test_logging.py reads the combined output.
"""

import logging

from accel import Accelerator
from accel.logging import get_logger

logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s", level=logging.INFO)
logger = get_logger(__name__)

try:
    logger.info("before the state exists")
except RuntimeError as error:
    print(f"EARLY-ERROR {error}", flush=True)

accelerator = Accelerator()
rank = accelerator.process_index

logger.info("main only")
logger.info(f"every process {rank}", main_process_only=False)
for i in range(3):
    logger.info(f"in order {rank} round {i}", in_order=True)
logger.debug("debug shows when ACCELERATE_LOG_LEVEL=DEBUG")
logger.warning_once("said once")
logger.warning_once("said once")

quiet = get_logger("quiet", log_level="ERROR")
quiet.warning("a warning below the quiet logger's level")
quiet.error(f"an error from {rank}", main_process_only=False)
accelerator.wait_for_everyone()
print(f"DONE {rank}", flush=True)
