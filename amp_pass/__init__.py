"""amp_pass: automatic mixed-precision (fp16/bf16) conversion of fp32 ONNX models.

Pure graph code: imports no celery, sqlalchemy or onnxruntime."""
