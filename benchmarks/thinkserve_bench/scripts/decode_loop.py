"""Tokens/s of the CPU decode loop (thinkserve_backend.decoding.generate), in process, at 64 / 256 / 1024 tokens,
before and after issue 16 (the KV cache kept in buffers the graph reads where they lie, never copied).

    thinkserve-bench decode_loop [--tokens 64 256 1024] [--repeat 2] [--models tiny large] [--name decode_loop]

Three loops, all driven by the same generate() (sampling, text stream), on graphs exported from the same weights:
  before  the graph that grows the cache by concatenation (exported here as thinkserve_build exported it before
          issue 16), each step a session.run with the whole cache as numpy inputs and `present.*` back as new
          numpy arrays
  bound   the same graph with IO binding: `present.*` fed back as onnxruntime values, no numpy conversion
          (issue 16's option (i), measured and not taken)
  after   the graph thinkserve_build exports now (thinkserve_build.decoder_graph) with decoding.KVCacheDecoder:
          one buffer per layer bound as the graph's input, the step's new keys and values written into it
Two decoders:
  tiny   the tiny profile's LLM (the `tiny-qwen2` recipe): `after` is model_repository/tiny/llm/1/decoder.onnx as
         served, `before` is exported from the recipe's checkpoint in the build cache
  large  a random-weight Qwen2 (hidden 768, 12 layers, 12 heads / 4 KV heads) built from a Qwen2Config, so that
         the KV cache is large (24 KiB a token) and copying it shows
Exports are cached under .thinkserve/bench/decode_loop/. Greedy, eos ignored (no eos ids), a fixed 16-token
prompt, max_context = prompt + the longest run; sessions made as Triton's model makes them (sessions.cpu_session,
2 intra-op threads, no spinning). The loops run in lockstep, one token of each in turn (the order alternating
between repeats), so that each position of each loop sees the same load on this shared machine; `--repeat`
runs per (model, tokens) after one discarded warm-up. Reported: tokens/s of the whole generate() (prefill
included), the median time per token over the first and the last 64 decode steps of the longest run (a
per-step cost that grows with the cache shows there), and whether all loops generated the same tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import numpy as np

from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import uncommitted_changes, write_and_show
from thinkserve_backend.decoding import GenerationParams, KVCacheDecoder, generate
from thinkserve_backend.sessions import cpu_session

TINY = Path("model_repository/tiny/llm/1")
CHECKPOINTS = Path(".thinkserve/cache/checkpoints")
CACHE = Path(".thinkserve/bench/decode_loop")
PROMPT_TOKENS = 16
WINDOW = 64  # decode steps averaged at the start and at the end of the longest run
LARGE = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
}


def export_concat_decoder(model, path: Path) -> Path:
    """The decoder graph as thinkserve_build exported it before issue 16 (decoder_graph.export_concatenating)."""
    from thinkserve_build import decoder_graph

    path.parent.mkdir(parents=True, exist_ok=True)
    return decoder_graph.export_concatenating(model.model, model.lm_head, model.config, False, path)


def _export_code() -> str:
    from thinkserve_build import decoder_graph

    return hashlib.sha256(Path(decoder_graph.__file__).read_bytes()).hexdigest()[:8]


def tiny_decoders() -> dict[str, Path]:
    served = TINY / "decoder.onnx"
    checkpoints = sorted(CHECKPOINTS.glob("tiny-qwen2-*"))
    if not served.exists() or not checkpoints:
        raise SystemExit(f"no {served} or tiny-qwen2 checkpoint in {CHECKPOINTS}: build the tiny profile first (make models)")
    before = CACHE / checkpoints[-1].name / "concat" / "decoder.onnx"
    if not before.exists():
        from transformers import Qwen2ForCausalLM

        export_concat_decoder(Qwen2ForCausalLM.from_pretrained(str(checkpoints[-1])).eval(), before)
    return {"before": before, "after": served}


def large_decoders(vocab_size: int) -> dict[str, Path]:
    """The large random Qwen2 (seed 0) exported both ways, once each (the `after` export again when
    thinkserve_build.decoder_graph changes)."""
    folder = CACHE / ("qwen2-" + "-".join(str(v) for v in (*LARGE.values(), vocab_size)))
    paths = {"before": folder / "concat" / "decoder.onnx", "after": folder / f"after-{_export_code()}" / "decoder.onnx"}
    if all(path.exists() for path in paths.values()):
        return paths
    import torch
    from thinkserve_build import decoder_graph
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size, max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=False, **LARGE
    )
    model = Qwen2ForCausalLM(config).eval()
    if not paths["before"].exists():
        export_concat_decoder(model, paths["before"])
    if not paths["after"].exists():
        paths["after"].parent.mkdir(parents=True, exist_ok=True)
        decoder_graph.export(model.model, model.lm_head, config, False, paths["after"])
    return paths


class SessionRunDecoder:
    """The loop before issue 16 on the concatenating graph, behind the interface generate() drives."""

    def __init__(self, session):
        self.session = session
        self.past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
        self.outputs = ["logits", *("present." + i.name[len("past_key_values.") :] for i in self.past)]

    def sequence(self) -> "SessionRunSequence":
        return SessionRunSequence(self)


class SessionRunSequence:
    def __init__(self, decoder: SessionRunDecoder):
        self.decoder, self.position = decoder, 0
        self.cache = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), dtype=np.float32) for i in decoder.past}

    def step(self, inputs: np.ndarray) -> np.ndarray:
        total = self.position + inputs.shape[1]
        feeds = {
            "input_ids": inputs,
            "attention_mask": np.ones((1, total), dtype=np.int64),
            "position_ids": np.arange(self.position, total, dtype=np.int64)[None, :],
            **self.cache,
        }
        outputs = self.decoder.session.run(self.decoder.outputs, feeds)
        self.cache = {spec.name: value for spec, value in zip(self.decoder.past, outputs[1:])}
        self.position = total
        return outputs[0][0, -1]


class BoundConcatDecoder(SessionRunDecoder):
    """Option (i) of issue 16, measured and not taken: the concatenating graph with IO binding, each step's
    `present.*` bound as the next step's past as onnxruntime values (no numpy conversion of the cache; the
    graph still concatenates a grown copy of it)."""

    def sequence(self) -> "BoundConcatSequence":
        return BoundConcatSequence(self)


class BoundConcatSequence(SessionRunSequence):
    def step(self, inputs: np.ndarray) -> np.ndarray:
        session = self.decoder.session
        total = self.position + inputs.shape[1]
        feeds = {
            "input_ids": inputs,
            "attention_mask": np.ones((1, total), dtype=np.int64),
            "position_ids": np.arange(self.position, total, dtype=np.int64)[None, :],
        }
        binding = session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name, value in self.cache.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for name in self.decoder.outputs:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        self.cache = {spec.name: value for spec, value in zip(self.decoder.past, outputs[1:])}
        self.position = total
        return outputs[0].numpy()[0, -1]


# loop -> (graph, decoder class): `before` and `bound` run the concatenating graph, `after` the one served now
LOOPS = {"before": ("before", SessionRunDecoder), "bound": ("before", BoundConcatDecoder), "after": ("after", KVCacheDecoder)}


def lockstep(decoders: dict, prompt: np.ndarray, tokens: int, decode, order: list[str]) -> dict:
    """Run one generate() per loop, advanced a token at a time in turn (in `order`), so that every loop's step
    at a position sees the same load on the machine. Seconds of each next() (the first includes the prefill)
    and the tokens, per loop."""
    params = GenerationParams(max_tokens=tokens)
    runs = {
        name: generate(decoders[name], prompt, params, decode, eos_token_ids=[], max_context=PROMPT_TOKENS + tokens + 1)
        for name in order
    }
    seconds = {name: [] for name in order}
    ids = {name: [] for name in order}
    for _ in range(tokens):
        for name in order:
            started = time.perf_counter()
            step = next(runs[name])
            seconds[name].append(time.perf_counter() - started)
            ids[name].extend(step.token_ids)
    return {name: (seconds[name], ids[name]) for name in order}


def measure(label: str, paths: dict[str, Path], token_counts: list[int], repeat: int, decode, vocab: int) -> dict:
    prompt = np.random.default_rng(7).integers(0, vocab, (1, PROMPT_TOKENS)).astype(np.int64)
    sessions = {graph: cpu_session(path, 2) for graph, path in paths.items()}
    decoders = {name: make(sessions[graph]) for name, (graph, make) in LOOPS.items()}
    names = list(LOOPS)
    lockstep(decoders, prompt, 16, decode, names)  # warm-up: first-run allocations and graph caches
    longest = max(token_counts)
    out = {
        "decoders": {graph: {"path": str(path), "mib": round(path.stat().st_size / 2**20, 1)} for graph, path in paths.items()},
        "runs": {name: {} for name in names},
        "same_tokens": {},
    }
    for tokens in token_counts:
        samples = {name: [] for name in names}
        same = True
        for index in range(repeat):
            order = names if index % 2 == 0 else names[::-1]  # alternate who goes first
            result = lockstep(decoders, prompt, tokens, decode, order)
            same = same and len({tuple(result[name][1]) for name in names}) == 1
            for name in names:
                samples[name].append(result[name][0])
        out["same_tokens"][str(tokens)] = same
        for name in names:
            entry = {
                "tokens_per_s": [tokens / sum(run) for run in samples[name]],
                "total_s": [sum(run) for run in samples[name]],
            }
            if tokens == longest:  # decode steps only: the first next() holds the prefill
                entry["first_window_ms"] = [float(np.median(run[1 : WINDOW + 1]) * 1000) for run in samples[name]]
                entry["last_window_ms"] = [float(np.median(run[-WINDOW:]) * 1000) for run in samples[name]]
            out["runs"][name][str(tokens)] = entry
            print(f"{label} {name} {tokens}: " + ", ".join(f"{t:.1f}" for t in entry["tokens_per_s"]) + " tok/s", flush=True)
    return out


def markdown(command: str, machine: dict, results: dict, token_counts: list[int], dirty: list[str]) -> str:
    longest = max(token_counts)
    lines = [
        "# CPU decode loop: tokens/s of generate()",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine['cpu']}, {machine['logical_cores']} logical cores, {machine['memory_gib']} GiB; "
        f"commit {machine['git_commit']}" + (f" (uncommitted changes in {len(dirty)} tracked files)" if dirty else "") + "  ",
        f"onnxruntime {machine['packages'].get('onnxruntime', '?')}, load average at the end {machine['load_average'][0]:.2f}",
        "",
        "Greedy, eos ignored, 16-token prompt, prefill included; each figure is one run; the three loops run in",
        "lockstep in one process, one token of each in turn. `before`: the concatenating graph, session.run with the",
        "cache as numpy each step; `bound`: the same graph with IO binding (the cache stays an onnxruntime value, the",
        "graph still concatenates); `after`: the graph exported now, which reads one KV buffer per layer where it lies",
        "and returns only the new keys and values (issue 16). ms/token: the median over the window. Timings on this shared",
        "2-core machine vary by about a third between runs (other sessions use its cores).",
        "",
        f"| decoder | loop | tokens | tokens/s (each run) | ms/token, first {WINDOW} steps | ms/token, last {WINDOW} steps | same tokens |",
        "|---|---|---:|---|---:|---:|---|",
    ]
    for label, result in results.items():
        for name, runs in result["runs"].items():
            for tokens in token_counts:
                entry = runs[str(tokens)]
                rates = " / ".join(f"{r:.1f}" for r in entry["tokens_per_s"])
                first = last = ""
                if tokens == longest:
                    first = " / ".join(f"{v:.2f}" for v in entry["first_window_ms"])
                    last = " / ".join(f"{v:.2f}" for v in entry["last_window_ms"])
                same = "yes" if result["same_tokens"][str(tokens)] else "no"
                lines.append(f"| {label} | {name} | {tokens} | {rates} | {first} | {last} | {same} |")
    lines += ["", "Decoders:", ""]
    for label, result in results.items():
        for graph, decoder in result["decoders"].items():
            lines.append(f"- {label}, graph of `{graph}`: `{decoder['path']}` ({decoder['mib']} MiB)")
    return "\n".join(lines) + "\n"


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=["tiny", "large"], default=["tiny", "large"])
    parser.add_argument("--name", default="decode_loop", help="result files benchmarks/results/NAME.{json,md}")


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()

    def decode(ids):
        return tokenizer.decode(list(ids))

    exports = {"tiny": tiny_decoders, "large": lambda: large_decoders(vocab)}
    paths = {label: exports[label]() for label in args.models}  # all exports first: they would disturb the timings
    results = {label: measure(label, paths[label], args.tokens, args.repeat, decode, vocab) for label in args.models}
    machine = machine_facts()
    dirty = uncommitted_changes()
    payload = {"command": command, "machine": machine, "uncommitted": dirty, "large_config": LARGE, "results": results}
    write_and_show(args.name, payload, markdown(command, machine, results, args.tokens, dirty), Path("benchmarks/results"))
