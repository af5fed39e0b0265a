"""``python -m accel <command>``: the ``accel`` command where its script is not on PATH (a cluster's module
environment, a venv not activated). Imports no torch for ``--help``, as the console script."""

import sys

from accel.cli import main

sys.exit(main())
