"""How the judger's two measures decide, and what a generated token costs to measure (issue 41, item 2).

The judger (orchestrator/pipeline/uncertainty.py) flags a probe answer as uncertain when its measure is above the
LLM's calibrated threshold. `entropy` (the default, the paper's) is the greedy probe's mean token entropy: it needs
each step's whole distribution, which the torch target now reads where the logits are and the gpu target's
engines ship for the probes' tokens only. `surprisal` is the mean -log p of a probe sampled at temperature 1: its
expectation at each step is that step's entropy, and it needs only the chosen tokens' log-probabilities (no
logits at all). This script records both probes on real documents' questions through the loop Triton runs
(decoding.generate over the torch target's checkpoint, on this machine's CPU), calibrates each threshold as the
build does (thinkserve_build.calibration: the same percentile of the calibration questions' probes), and reports
how often the surprisal judger decides as the entropy judger does, over several probe seeds.

It also measures what crosses from the model's device to the Python that builds a response, per token, before
(the step's logits handed over as numpy, log-softmaxed there) and after (torch_decoding.DeviceLogits: the token,
its log-probability and the entropy computed where the logits are), with the decode time per token of each.

    thinkserve-bench judger_measures --model-repository model_repository/tiny-torch
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.models.chat_template import ChatTemplate
from orchestrator.models.protocol import mean_entropy_nats, mean_surprisal_nats
from orchestrator.prompts import SYSTEM
from thinkserve_backend.decoding import GenerationParams, generate
from thinkserve_backend.generator_runtime import torch_generator
from thinkserve_bench.machine import machine_facts
from thinkserve_bench.result_files import uncommitted_changes, write_and_show
from thinkserve_build import calibration

DATASET = Path("../shared/benchmarks/mmlongbench-dev")
EVIDENCE_CHARS = 1500  # of the evidence page's text layer in each probe prompt


@dataclass(frozen=True)
class Served:
    """The LLM as the repository serves it: its decoder, tokenizer and declared facts."""

    decoder: object
    tokenizer: object
    chat: ChatTemplate
    eos: list[int]
    max_context: int
    vocabulary: int
    declared: dict  # the config's judger thresholds


def load_llm(repository: Path) -> Served:
    import torch
    from google.protobuf import text_format
    from tokenizers import Tokenizer
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((repository / "llm" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    if parameters.get("runtime") != "torch":
        raise SystemExit(f"{repository}/llm is not served by the torch target (runtime {parameters.get('runtime')!r})")
    version = repository / "llm" / "1"
    max_context = int(parameters["max_context"])
    runtime = torch_generator(version, False, max_context, torch.device("cpu"), torch.float32)
    return Served(
        decoder=runtime.decoder,
        tokenizer=Tokenizer.from_file(str(version / parameters["tokenizer_file"])),
        chat=ChatTemplate(parameters["chat_template"], json.loads(parameters["chat_template_variables"])),
        eos=json.loads(parameters["eos_token_ids"]),
        max_context=max_context,
        vocabulary=int(parameters["vocab_size"]),
        declared={k: float(parameters[k]) for k in ("judger_entropy_nats", "judger_surprisal_nats") if k in parameters},
    )


def dataset_prompts(served: Served, dataset: Path, limit: int) -> list[str]:
    """Each question with its first evidence page's text (the first page for unanswerable ones), as a probe reads
    them: the orchestrator's rules, one numbered evidence entry, the model's chat format."""
    import pypdfium2

    questions = json.loads((dataset / "questions.json").read_text())[:limit]
    prompts, documents = [], {}
    for question in questions:
        pages = json.loads(question["evidence_pages"]) or [1]
        name = question["doc_id"]
        if name not in documents:
            documents[name] = pypdfium2.PdfDocument(str(dataset / "documents" / name))
        document = documents[name]
        page = min(pages[0], len(document)) - 1
        text = document[page].get_textpage().get_text_range()[:EVIDENCE_CHARS].strip()
        user = f"Evidence:\n[1] ({name}, page {page + 1})\n{text}\n\nQuestion: {question['question']}"
        prompts.append(served.chat(SYSTEM, user))
    return prompts


def probe(served: Served, prompt: str, params: GenerationParams) -> list:
    ids = np.array([served.tokenizer.encode(prompt, add_special_tokens=False).ids], dtype=np.int64)
    return list(generate(served.decoder, ids, params, lambda t: served.tokenizer.decode(list(t)), served.eos, served.max_context))


def measures(served: Served, prompt: str, seeds: list[int]) -> dict:
    """The greedy probe's mean entropy and mean greedy surprisal, and each seed's sampled probe's mean surprisal."""
    greedy = probe(served, prompt, GenerationParams(max_tokens=calibration.PROBE_TOKENS))
    entropies = [e for step in greedy for e in step.normalized_entropy]
    greedy_log_probs = [p for step in greedy for p in step.log_probs]
    sampled = {}
    for seed in seeds:
        steps = probe(served, prompt, GenerationParams(calibration.PROBE_TOKENS, temperature=1.0, top_p=1.0, seed=seed))
        sampled[seed] = mean_surprisal_nats([p for step in steps for p in step.log_probs], served.vocabulary)
    return {
        "entropy": mean_entropy_nats(entropies, served.vocabulary),
        "greedy_surprisal": mean_surprisal_nats(greedy_log_probs, served.vocabulary),
        "sampled_surprisal": sampled,
    }


class HostLogitsSequence:
    """The decoding loop before issue 41: each step's logits handed to the host as numpy and measured there."""

    def __init__(self, sequence):
        self.sequence, self.host_bytes = sequence, 0

    def step(self, inputs: np.ndarray) -> np.ndarray:
        logits = np.asarray(self.sequence.step(inputs))
        self.host_bytes += logits.nbytes
        return logits


class CountingSequence:
    """The decoding loop now: what DeviceLogits moved to the host, summed."""

    def __init__(self, sequence):
        self.sequence, self.host_bytes = sequence, 0
        self.pending = None

    def step(self, inputs: np.ndarray):
        self._count()
        self.pending = self.sequence.step(inputs)
        return self.pending

    def _count(self) -> None:
        if self.pending is not None:
            self.host_bytes += self.pending.host_bytes
            self.pending = None


class Instrumented:
    """A decoder whose sequences are wrapped (`wrap`), keeping the last one to read its bytes."""

    def __init__(self, decoder, wrap):
        self.decoder, self.wrap, self.last = decoder, wrap, None

    def sequence(self):
        self.last = self.wrap(self.decoder.sequence())
        return self.last


def transfer_cost(served: Served, prompts: list[str], tokens: int, repeat: int) -> dict:
    """Bytes from the device to the host per generated token, and decode time per token, before and after; the two
    loops alternate run by run, so load on the machine falls on both."""
    loops = {"host logits (before)": HostLogitsSequence, "device measures (after)": CountingSequence}
    totals = {label: {"moved": 0, "tokens": 0, "seconds": []} for label in loops}
    for _ in range(repeat):
        for label, wrap in loops.items():
            decoder, total = Instrumented(served.decoder, wrap), totals[label]
            began, run_tokens = time.perf_counter(), 0
            for prompt in prompts:
                ids = np.array([served.tokenizer.encode(prompt, add_special_tokens=False).ids], dtype=np.int64)
                steps = list(generate(decoder, ids, GenerationParams(max_tokens=tokens), lambda t: "", [], served.max_context))
                if isinstance(decoder.last, CountingSequence):
                    decoder.last._count()
                total["moved"] += decoder.last.host_bytes
                run_tokens += sum(len(s.token_ids) for s in steps)
            total["seconds"].append((time.perf_counter() - began) / run_tokens)
            total["tokens"] += run_tokens
    # The prompt's step hands its logits over too: bytes per generated token include it, as a stream's do.
    return {
        label: {"bytes_per_token": t["moved"] / t["tokens"], "ms_per_token_median": 1000 * float(np.median(t["seconds"])),
                "ms_per_token_runs": [1000 * s for s in t["seconds"]], "tokens": t["tokens"]}
        for label, t in totals.items()
    }


def decide(values: list[float], threshold: float) -> np.ndarray:
    return np.asarray(values) > threshold


def agreement(records: list[dict], calibrating: list[dict], seeds: list[int], percentile: float) -> dict:
    """Both judgers' thresholds calibrated as the build does (the percentile of the calibration probes), then
    the share of the questions on which they decide alike, per seed."""
    entropy_threshold = float(np.percentile([r["entropy"] for r in calibrating], percentile))
    exact = decide([r["entropy"] for r in records], entropy_threshold)
    per_seed = {}
    for seed in seeds:
        threshold = float(np.percentile([r["sampled_surprisal"][seed] for r in calibrating], percentile))
        approximate = decide([r["sampled_surprisal"][seed] for r in records], threshold)
        per_seed[seed] = {"threshold": threshold, "agreement": float(np.mean(exact == approximate)),
                          "flagged": float(np.mean(approximate))}
    greedy_threshold = float(np.percentile([r["greedy_surprisal"] for r in calibrating], percentile))
    greedy = decide([r["greedy_surprisal"] for r in records], greedy_threshold)
    return {
        "entropy_threshold": entropy_threshold,
        "exact_flagged": float(np.mean(exact)),
        "sampled": per_seed,
        "greedy_surprisal": {"threshold": greedy_threshold, "agreement": float(np.mean(exact == greedy))},
    }


def rank_correlation(a: list[float], b: list[float]) -> float:
    ranks = [np.argsort(np.argsort(x)) for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def markdown(command: str, machine: dict, payload: dict, dirty: list[str]) -> str:
    lines = [
        "# The judger's measures: decisions and cost per token",
        "",
        f"`{command}`",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('logical_cores', '?')} cores; commit {machine.get('git_commit', '?')}"
        + (f" with uncommitted changes ({len(dirty)} files)" if dirty else ""),
        "",
        f"LLM: {payload['repository']} (torch target, CPU), vocabulary {payload['vocabulary']}; probes of "
        f"{calibration.PROBE_TOKENS} tokens; thresholds at the {payload['percentile']:g}th percentile of the "
        f"{payload['calibration_prompts']} calibration questions' probes (as the build calibrates them).",
        "",
        "## Decisions on real documents' questions",
        "",
        f"{payload['questions']} mmlongbench-dev questions, each with its first evidence page's text layer "
        f"(first {EVIDENCE_CHARS} characters). The exact judger (greedy probe, mean entropy) flags "
        f"{payload['agreement']['exact_flagged']:.1%} of them.",
        "",
        "| judger | threshold (nats) | flags | agrees with the exact entropy judger |",
        "|---|---|---|---|",
        f"| entropy of the greedy probe (the default, on every target) | {payload['agreement']['entropy_threshold']:.3f} | "
        f"{payload['agreement']['exact_flagged']:.1%} | (itself) |",
    ]
    for seed, row in payload["agreement"]["sampled"].items():
        lines.append(f"| surprisal of a probe sampled at temperature 1, seed {seed} (uncertainty.measure = surprisal) | {row['threshold']:.3f} | "
                     f"{row['flagged']:.1%} | **{row['agreement']:.1%}** |")
    greedy = payload["agreement"]["greedy_surprisal"]
    lines += [
        f"| surprisal of the greedy probe (for comparison: TensorRT-LLM reports 0 under greedy decoding) | {greedy['threshold']:.3f} | | {greedy['agreement']:.1%} |",
        "",
        f"Rank correlation over the questions between the greedy probe's entropy and the seed-{payload['seeds'][0]} "
        f"sampled probe's surprisal: {payload['rank_correlation']:.3f}.",
        "",
        "## What crosses from the model's device to the host per generated token (torch target)",
        "",
        "| decoding loop | bytes per token | ms per token (median of runs) |",
        "|---|---|---|",
    ]
    for label, row in payload["transfer"].items():
        lines.append(f"| {label} | {row['bytes_per_token']:,.0f} | {row['ms_per_token_median']:.2f} |")
    lines += [
        "",
        "Both loops compute the same token, log-probability and entropy (tests/backend/test_sampling.py checks it to "
        "1e-9), so the entropy judger decides exactly as before on the torch target. Per token, a stream's response "
        "to the orchestrator is the same before and after: token id, log-probability and normalised entropy (4 bytes "
        "each) and the text delta.",
        "",
        f"On the gpu target the TensorRT-LLM engine streamed generation_logits in fp32 for every token: 4 x the padded "
        f"vocabulary ({4 * payload['vocabulary']:,} bytes for this vocabulary, 607,744 for Qwen2.5's 151,936), copied "
        "to the host and log-softmaxed in numpy. Now only the judger's probes ask for them (their "
        f"{calibration.PROBE_TOKENS} tokens, at most 1 + uncertainty.max_iterations probes a question), and every "
        "answer, decoupler and router token streams output_log_probs, 4 bytes a token; the probes' entropies are the "
        "same computation as before, so the decisions are unchanged (computed, not measured: no GPU here).",
        "",
    ]
    return "\n".join(lines)


def declare_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository/tiny-torch"))
    parser.add_argument("--dataset", type=Path, default=DATASET, help="MMLongBench-Doc's layout: questions.json, documents/")
    parser.add_argument("--questions", type=int, default=307, help="the first N questions")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--percentile", type=float, default=75.0, help="the profile's judger_percentile")
    parser.add_argument("--transfer-prompts", type=int, default=8)
    parser.add_argument("--transfer-tokens", type=int, default=64)
    parser.add_argument("--transfer-repeat", type=int, default=3)
    parser.add_argument("--name", default="judger_measures")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))


def run_benchmark(args: argparse.Namespace, command: str) -> None:
    served = load_llm(args.model_repository)
    calibration_prompts = calibration.probe_prompts(served.chat)
    prompts = dataset_prompts(served, args.dataset, args.questions)
    calibrating = [measures(served, p, args.seeds) for p in calibration_prompts]
    records = [measures(served, p, args.seeds) for p in prompts]
    payload = {
        "repository": str(args.model_repository),
        "vocabulary": served.vocabulary,
        "declared_thresholds": served.declared,
        "percentile": args.percentile,
        "calibration_prompts": len(calibration_prompts),
        "questions": len(prompts),
        "seeds": args.seeds,
        "agreement": agreement(records, calibrating, args.seeds, args.percentile),
        "rank_correlation": rank_correlation([r["entropy"] for r in records],
                                             [r["sampled_surprisal"][args.seeds[0]] for r in records]),
        "transfer": transfer_cost(served, prompts[: args.transfer_prompts], args.transfer_tokens, args.transfer_repeat),
        "records": records,
        "calibration_records": calibrating,
    }
    machine, dirty = machine_facts(), uncommitted_changes()
    payload["machine"], payload["uncommitted"] = machine, dirty
    write_and_show(args.name, payload, markdown(command, machine, payload, dirty), args.out)
