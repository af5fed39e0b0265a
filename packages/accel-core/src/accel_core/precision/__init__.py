"""Mixed precision: the Precision classes (``modes``), core's choice among them, which a strategy's
``make_precision`` uses by default (``choice``), and the fp8 recipe handlers (``fp8_recipes``, plain
data: accel-fp8 builds the fp8 precisions from them)."""
