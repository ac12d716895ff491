"""ampci service layer: settings, store, scheduler, regression detection, webhook/API, CLI.

Never imports onnxruntime (checked by tests/test_layering.py)."""
