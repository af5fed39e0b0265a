"""How a job's processes are laid out: ``ParallelismConfig`` (sizes of the named mesh dimensions,
resolved from arguments and ``ACCEL_*`` variables, no torch: ``config``) and ``ParallelDims`` (the
resolved config with the ``DeviceMesh`` built from it and the groups everything asks for: ``dims``)."""
