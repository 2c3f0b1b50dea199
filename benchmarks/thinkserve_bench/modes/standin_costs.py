"""Cost per query on realistic-size models: a cost run's model calls replayed on stand-ins timed in PyTorch.

`thinkserve-bench standins --from-cost bench-cost.json` reads every measured query of a cost run (routed and
always-Complex, same questions), takes the shape of each of its model calls (call_shapes.py), times those
shapes on the hf profile's architectures with random weights (standins.py: on the GPU when torch sees one),
and prices the model-seconds with the price table's deployment for this device. At concurrency N, N queries'
calls are timed as one batch and each query is charged 1/N: what a loaded GPU deployment pays per query.
Needs torch and transformers, not Triton: it runs where engines cannot be built.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..call_shapes import distinct_shapes, query_calls, query_seconds, routed_saving, series_cost, usage_rows
from ..prices import PriceTable
from ..mode_reports import _pct, _usd
from thinkserve_build.standins import image_positions

from ..standin_timing import TorchTimer

CONFIGS = ("routed", "complex")


def source_image_tokens(profile: str, repository_root: Path = Path("model_repository")) -> Optional[int]:
    """The deployed VLM's prompt positions per image, from its config.pbtxt (tiny: 36), or None when not built here."""
    path = repository_root / profile / "vlm" / "config.pbtxt"
    if not path.is_file():
        return None
    match = re.search(r'key:\s*"image_tokens_per_image"\s*value\s*\{\s*string_value:\s*"(\d+)"', path.read_text())
    return int(match.group(1)) if match else None


def device_deployment(device_name: str, prices: PriceTable) -> str:
    """The price-table deployment that prices this device: the GPU's model when the table has it, else the table's own."""
    name = device_name.lower()
    for kind in prices.deployments:
        if kind != "cpu" and kind in name:
            return kind
    return prices.deployment


def run_standins(cost: dict, timer: TorchTimer, prices: PriceTable, deployment: str, concurrency: Sequence[int],
                 image_tokens: int, progress: Callable[[str], None] = lambda _: None) -> dict:
    configs = cost["result"]["configs"]
    # the questions answered both ways (the cost run asked the same questions in the same order)
    both = [pair for pair in zip(*(configs[label]["records"] for label in CONFIGS))
            if all(r.get("status") == "ok" for r in pair)]
    queries = {label: [pair[n] for pair in both] for n, label in enumerate(CONFIGS)}
    calls = {label: [query_calls(usage_rows(r), image_tokens) for r in records] for label, records in queries.items()}
    shapes = distinct_shapes([q for label in CONFIGS for q in calls[label]], concurrency)
    by_model = defaultdict(list)
    for shape in shapes:
        by_model[shape.model].append(shape)
    for model, model_shapes in sorted(by_model.items()):
        progress(f"timing {len(model_shapes)} call shapes of the {model} stand-in")
        for n, shape in enumerate(model_shapes, 1):
            seconds = timer(shape)
            progress(f"  {n}/{len(model_shapes)} batch {shape.batch} x {shape.tokens} tokens"
                     + (f", {shape.images} image(s)" if shape.images else "")
                     + (f", {shape.new_tokens} generated" if shape.new_tokens else "") + f": {seconds:.3f} s")
        timer.release(model)
    per_second = prices.deployments[deployment].usd_per_model_second
    levels = {}
    for n in concurrency:
        seconds = {label: [query_seconds(q, timer, n) for q in calls[label]] for label in CONFIGS}
        series = {label: series_cost(seconds[label], per_second) for label in CONFIGS}
        routes = defaultdict(list)
        for record, figures in zip(queries["routed"], seconds["routed"]):
            routes[record.get("route") or "unknown"].append(figures)
        levels[str(n)] = {
            "series": {label: s.as_dict() for label, s in series.items()},
            "routed_by_route": {route: series_cost(figures, per_second).as_dict() for route, figures in sorted(routes.items())},
            "saving_routed_vs_complex": routed_saving(series["routed"], series["complex"]),
        }
    spec = timer.standins
    return {
        "mode": "standins",
        "source": {"command": cost.get("command"), "machine": cost.get("machine"), "questions": len(queries["routed"])},
        "device": timer.device, "dtype": str(timer.dtype).replace("torch.", ""), "preset": timer.preset,
        "repeats": timer.repeats, "decode_probe": timer.decode_probe,
        "source_image_tokens": image_tokens,
        "deployment": deployment, "deployment_price": prices.deployments[deployment].model_dump(mode="json"),
        "standins": {role: {"mirrors": s.mirrors, "class": s.model_class + (" + SiglipVisionModel" if s.vision else ""),
                            "parameters": timer.parameters.get(role),
                            "image_positions": image_positions(s) or None} for role, s in spec.items()
                     if role in timer.parameters},
        "timings": timer.timings(),
        "concurrency": levels,
    }


def markdown(payload: dict) -> str:
    r, m = payload["result"], payload["machine"]
    price = r["deployment_price"]
    lines = [
        "# Cost per query on realistic-size stand-in models",
        "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {m['cpu']}, {m['logical_cores']} logical cores, {m['memory_gib']} GiB, GPU: {m['gpu']}; torch device "
        f"`{r['device']}`, {r['dtype']}  ",
        f"Calls replayed: {r['source']['questions']} questions of `{r['source']['command']}` (its machine: "
        f"{(r['source']['machine'] or {}).get('cpu', '?')}), routed and always-Complex  ",
        f"Priced as deployment `{r['deployment']}`: ${price['usd_per_unit_hour']}/{price['unit']}-hour x "
        f"{price['units_per_model']} per model-second",
        "",
        *([f"**Preset `{r['preset']}`: toy dimensions, for tests; these timings are not model costs.**", ""]
          if r["preset"] != "hf" else []),
        "**Stand-ins, not the served engines:** each role is the published architecture of the `hf` profile's "
        "checkpoint with random weights, run eagerly in PyTorch (SDPA attention) at the shapes the cost run's "
        "queries sent (mean shape per call; token counts are the source deployment's tokenizers'; the VLM's image "
        f"positions replaced: {r['source_image_tokens']} per image in the source, the stand-in's own here). "
        "Generated tokens are timed as "
        f"{r['decode_probe']} decoding steps after the prefill, scaled to the count. TensorRT engines would be faster: "
        "read these as an upper bound of model time, and the ratios between series as the finding.",
        "",
        "| role | mirrors | class | parameters |",
        "|---|---|---|---:|",
    ]
    for role, s in r["standins"].items():
        lines.append(f"| {role} | {s['mirrors']} | {s['class']} | {s['parameters'] / 1e6:,.1f} M |")
    lines += ["", "| concurrency | series | queries | model-seconds / query | $ / 1,000 queries |", "|---:|---|---:|---:|---:|"]
    for n, level in r["concurrency"].items():
        rows = {**{label: s for label, s in level["series"].items()},
                **{f"routed, route {k}": v for k, v in level["routed_by_route"].items()}}
        for label, s in rows.items():
            lines.append(f"| {n} | {label} | {s['queries']} | {s['model_seconds_per_query']:.4f} | "
                         f"{_usd(s['usd_per_1000_queries'])} |")
    lines.append("")
    for n, level in r["concurrency"].items():
        lines.append(f"- Concurrency {n}: routed saves **{_pct(level['saving_routed_vs_complex'])}** of the stand-in "
                     "model-seconds against always-Complex.")
    lines += ["", "Model-seconds per query by model (concurrency, routed / complex):", "",
              "| concurrency | model | routed s | complex s |", "|---:|---|---:|---:|"]
    for n, level in r["concurrency"].items():
        a = level["series"]["routed"]["model_seconds_per_query_by_model"]
        b = level["series"]["complex"]["model_seconds_per_query_by_model"]
        for model in sorted(set(a) | set(b)):
            lines.append(f"| {n} | {model} | {a.get(model, 0):.4f} | {b.get(model, 0):.4f} |")
    lines += ["", "Timed call shapes (median of the repeats after a warm-up):", "",
              "| model | batch | tokens / row | images / row | generated | seconds |", "|---|---:|---:|---:|---:|---:|"]
    for t in r["timings"]:
        lines.append(f"| {t['model']} | {t['batch']} | {t['tokens']} | {t['images']} | {t['new_tokens']} | {t['seconds']:.4f} |")
    return "\n".join(lines) + "\n"
