"""What accel keeps for scripts written against Accelerate's ``accelerate.utils``: the ``is_*_available``
probes (``availability``), environment helpers (``env_utils``), memory helpers (``memory``), version
checks (``versions``) and small script helpers (``reference_utils``), re-exported by ``accel.utils``.
Nothing in the rest of accel-core depends on these for its own work but the probes."""
