"""One module per in-process scenario; each has `run(harness, quick, **options) -> dict` of figures."""
