"""`accel launch --main-process-port PORT` as the later of two jobs started together: the port was free when
check_port_free looked (skipped here) and another process listens on it by the time torch's agent starts."""

import sys

from accel import cli
from accel_launch import run

run.check_port_free = lambda plan: None  # the check passed: the port was taken after it
sys.exit(cli.main(["launch", "--cpu", "-n", "2", "--main-process-port", sys.argv[1], sys.argv[2]]))
