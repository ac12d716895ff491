"""ampci workers: everything that executes one job (zoo, pass at a revision, onnxruntime,
faithful emulation, metrics, latency, convergence) and the Celery app with thin tasks."""
