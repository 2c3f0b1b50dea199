"""Tokens/s of the CPU decode loop (thinkserve_backend.decoding.generate), in process, at 64 / 256 / 1024 tokens.

    python -m benchmarks.decode_loop [--tokens 64 256 1024] [--repeat 2] [--models tiny large] [--name decode_loop]

Two decoders, both exported by thinkserve_build.export's decoder path (KVCacheDecoderExport + _export_decoder):
  tiny   the tiny profile's LLM (the `tiny-qwen2` recipe) as served: model_repository/tiny/llm/1/
  large  a random-weight Qwen2 (hidden 768, 12 layers, 12 heads / 4 KV heads), built from a Qwen2Config and
         exported here once (cached under .thinkserve/bench/decode_loop/), so that the KV cache is large
         (24 KiB a token) and copying it each step shows
Greedy, eos ignored (no eos ids), a fixed 16-token prompt, max_context = prompt + the longest run; the
session is made as Triton's model makes it (sessions.cpu_session, 2 intra-op threads, no spinning).
Each (model, tokens) is run `--repeat` times per loop, the loops interleaved, after one discarded warm-up.
Reported: tokens/s of the whole generate() (prefill included), and the mean time per token over the first and
the last 64 decode steps of the longest run (a per-step cost that grows with the cache shows there).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from orchestrator.bench.measure import invocation, machine_info, uncommitted_changes, write_and_show
from thinkserve_backend.decoding import GenerationParams, KVCacheDecoder, generate
from thinkserve_backend.sessions import cpu_session

TINY = Path("model_repository/tiny/llm/1")
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


def tiny_decoder() -> Path:
    found = sorted(TINY.glob("decoder*.onnx"))
    if not found:
        raise SystemExit(f"no decoder in {TINY}: build the tiny profile first (make models)")
    return found[0]


def large_decoder(vocab_size: int) -> Path:
    """The large random Qwen2, exported through the same code as the profiles' LLMs (once; then reused)."""
    name = "qwen2-" + "-".join(str(v) for v in (*LARGE.values(), vocab_size))
    out = CACHE / name
    path = out / "decoder.onnx"
    if path.exists():
        return path
    import torch
    from thinkserve_build.export import KVCacheDecoderExport, _export_decoder
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size, max_position_embeddings=4096, initializer_range=0.2, tie_word_embeddings=False, **LARGE
    )
    model = Qwen2ForCausalLM(config).eval()
    return _export_decoder(KVCacheDecoderExport(model.model, model.lm_head, config, takes_embeddings=False).eval(), out)


def run_once(decoder: KVCacheDecoder, prompt: np.ndarray, tokens: int, decode) -> list[float]:
    """Seconds from the call to each generated token (the first includes the prefill)."""
    params = GenerationParams(max_tokens=tokens)
    started = time.perf_counter()
    stamps = []
    for step in generate(decoder, prompt, params, decode, eos_token_ids=[], max_context=PROMPT_TOKENS + tokens + 1):
        stamps.append(time.perf_counter() - started)
        if step.finish_reason:
            break
    if len(stamps) != tokens:
        raise RuntimeError(f"expected {tokens} tokens, got {len(stamps)}")
    return stamps


def measure(label: str, path: Path, loops: dict, token_counts: list[int], repeat: int, decode, vocab: int) -> dict:
    session = cpu_session(path, 2)
    prompt = np.random.default_rng(7).integers(0, vocab, (1, PROMPT_TOKENS)).astype(np.int64)
    decoders = {name: make(session) for name, make in loops.items()}
    for decoder in decoders.values():  # warm-up: first-run allocations and graph caches
        run_once(decoder, prompt, 16, decode)
    longest = max(token_counts)
    out = {"decoder": str(path), "file_mib": round(path.stat().st_size / 2**20, 1), "runs": {}}
    for tokens in token_counts:
        rows = {name: [] for name in decoders}
        for _ in range(repeat):
            for name, decoder in decoders.items():
                rows[name].append(run_once(decoder, prompt, tokens, decode))
        for name, runs in rows.items():
            totals = [run[-1] for run in runs]
            entry = {
                "tokens_per_s": [tokens / total for total in totals],
                "total_s": totals,
            }
            if tokens == longest:
                steps = [np.diff(run) for run in runs]
                entry["first_window_ms"] = [float(np.mean(s[:WINDOW]) * 1000) for s in steps]
                entry["last_window_ms"] = [float(np.mean(s[-WINDOW:]) * 1000) for s in steps]
            out["runs"].setdefault(name, {})[str(tokens)] = entry
            print(f"{label} {name} {tokens}: " + ", ".join(f"{t:.1f}" for t in entry["tokens_per_s"]) + " tok/s", flush=True)
    return out


def loops() -> dict:
    return {"generate": KVCacheDecoder}


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
        "Greedy, eos ignored, 16-token prompt, prefill included; each figure is one run (runs of the loops",
        "interleaved in one process). Timings on this shared 2-core machine vary by about a third between runs.",
        "",
        f"| decoder | loop | tokens | tokens/s (each run) | ms/token, first {WINDOW} steps | ms/token, last {WINDOW} steps |",
        "|---|---|---:|---|---:|---:|",
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
                lines.append(f"| {label} | {name} | {tokens} | {rates} | {first} | {last} |")
    lines += ["", "Decoders:", ""]
    for label, result in results.items():
        lines.append(f"- {label}: `{result['decoder']}` ({result['file_mib']} MiB)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=["tiny", "large"], default=["tiny", "large"])
    parser.add_argument("--name", default="decode_loop", help="result files benchmarks/results/NAME.{json,md}")
    args = parser.parse_args(argv)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TINY / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()

    def decode(ids):
        return tokenizer.decode(list(ids))

    paths = {"tiny": tiny_decoder, "large": lambda: large_decoder(vocab)}
    results = {}
    for label in args.models:
        results[label] = measure(label, paths[label](), loops(), args.tokens, args.repeat, decode, vocab)
    machine = machine_info()
    dirty = uncommitted_changes()
    command = invocation("decode_loop", argv)
    payload = {"command": command, "machine": machine, "uncommitted": dirty, "large_config": LARGE, "results": results}
    write_and_show(args.name, payload, markdown(command, machine, results, args.tokens, dirty), Path("benchmarks/results"))


if __name__ == "__main__":
    main()
