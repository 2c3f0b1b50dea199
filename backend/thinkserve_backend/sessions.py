"""onnxruntime sessions as every ThinkServe model runs them (also used by benchmarks for in-process baselines)."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort


def cpu_session(path: Path, intra_op_threads: int) -> ort.InferenceSession:
    """A CPU session that shares the machine politely with the other models of the server."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning worker threads burn the CPU that the other models' stubs need on small machines.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # The memory-pattern cache keeps one plan per distinct input shape, and the arena keeps what they held:
    # with ragged batches (every batch size x token length) the encoder stub grew +80%/h in the soak. Off, it
    # stays flat at the same speed (measured in docs/measured/faults-fuzz-soak.md).
    options.enable_mem_pattern = False
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
