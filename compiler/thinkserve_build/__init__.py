"""ThinkServe's model compiler: exports every model of a profile to ONNX and writes a Triton model repository.

Runs in the project environment (torch, transformers, onnx). Named so it cannot shadow PyPA's `build`.
"""
