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
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
