"""The GPU measurements' options: the parts, their sizes and windows, the cost run replayed, and the deadline."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PARTS = ("encoders", "generators", "mix", "e2e")
DEFAULT_COST = ROOT / "benchmarks" / "results" / "bench" / "bench-cost-llm.json.gz"  # committed gzipped (result_files.read_json)
DEFAULT_CORPUS = ROOT / ".gpu-pack" / "corpus"  # the end-to-end part's knowledge-base inputs (corpus.py), carried


# --quick's generator rounds: a looser precision, fewer rounds and tokens
QUICK_GENERATORS = dict(generator_precision=0.10, generator_max_rounds=6, generator_min_tokens=128)


@dataclass
class Options:
    parts: tuple[str, ...]
    device: str
    batches: tuple[int, ...] = (1, 8, 32)
    inflight: int = 4  # Triton requests in flight at the largest batch (besides one at a time)
    seconds: float = 1.5  # timed seconds per encoder case and path
    min_calls: int = 5
    streams: tuple[int, ...] = (1, 8, 32)
    generators: tuple[str, ...] = ("llm", "vlm")  # the generators measured (public model names)
    prompt_tokens: int = 1024
    new_tokens: int = 128
    # generator levels run in rounds (both paths each) until both tokens/s are within this relative half-width of
    # their 95% interval, over at least the minimum rounds and tokens a path, or the maximum rounds ran
    generator_precision: float = 0.05
    generator_min_rounds: int = 3
    generator_max_rounds: int = 10
    generator_min_tokens: int = 512
    mix_concurrency: tuple[int, ...] = (1, 4, 16)
    mix_warmup_s: float = 2.0
    mix_window_s: float = 8.0
    cost: Path = DEFAULT_COST
    cost_config: str = "routed"
    source_image_tokens: int = 36  # the cost run's VLM (tiny: 96 px / 16 px patches = 36 positions an image)
    networks: tuple[str, ...] = ()  # the encoder networks measured (empty: every one)
    deadline: float = math.inf  # epoch seconds: no new unit of work starts that would end after it
    # the end-to-end part (end_to_end.py): levels, each route's closed loop, and the corpus it ingests first
    e2e_concurrency: tuple[int, ...] = (1, 8, 32)
    e2e_warmup_s: float = 3.0
    e2e_window_s: float = 20.0
    e2e_straggler_s: float = 10.0  # a closed window's queries still running get this long, then are cancelled
    e2e_questions: int = 0  # questions per route replayed (0: every one the cost run routed there)
    corpus: Path = DEFAULT_CORPUS

    @classmethod
    def quick(cls, parts: tuple[str, ...], device: str, **overrides) -> "Options":
        """About a third of the full run's time: shorter windows, fewer generated tokens."""
        values = dict(seconds=0.6, min_calls=3, new_tokens=32, mix_warmup_s=1.0, mix_window_s=3.0, e2e_warmup_s=1.0,
                      e2e_window_s=8.0, e2e_straggler_s=5.0)
        return cls(parts, device, **{**values, **QUICK_GENERATORS, **overrides})

    def left(self) -> float:
        return self.deadline - time.time()

