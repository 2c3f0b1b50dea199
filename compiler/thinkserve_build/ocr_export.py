"""The OCR role: PP-OCR's three ONNX networks made servable, and checked against the originals before acceptance.

PaddleOCR exports its networks to ONNX already, so nothing is traced here. What the build does to each graph:
- names its input and outputs for the contract between the served pipeline and its networks (`image` ->
  `probability` / `probabilities` / `classes` + `probabilities`), the same names on every target;
- the recogniser gets its per-column best class, that class's probability and the space's probability computed
  in the graph (ArgMax, ReduceMax and a Gather after its softmax): greedy CTC and the word-space rule read nothing
  else, and the served output shrinks from [n, T, 6,625] floats (1 MB a line) to [n, T] three times;
- the dictionary the recogniser's metadata holds becomes `alphabet.json` beside it.
Then each exported graph runs beside the original in onnxruntime on a page drawn here (known words, one line
upside down): the detector's map and the classifier's probabilities must match, the recogniser's classes must be
the original's argmax, and the whole pipeline (thinkserve_backend.ocr) must read the drawn words back, from the
page upright and turned upside down.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper
from thinkserve_backend import ocr

from .onnx_tools import ExportMismatchError, check_close, session
from .profiles import OcrSpec

Log = Callable[[str], None]
DETECTOR, CLASSIFIER, RECOGNIZER, ALPHABET = "detector.onnx", "classifier.onnx", "recognizer.onnx", "alphabet.json"
INPUT = "image"
RECOGNIZER_OUTPUTS = ["classes", "probabilities", "space_probability"]
# What the drawn check page says, and the words that must be read back (case folded).
SAMPLE_LINES = ("Quarterly revenue rose 12% to $4.2 billion", "Table 3: Operating income by region", "Upside down line 2024")
SAMPLE_WORDS = ("quarterly revenue rose", "operating income by region", "upside down line 2024")


def export_ocr(location: str, spec: OcrSpec, out: Path, log: Log = print, formats: frozenset[str] = frozenset({"onnx"})) -> dict:
    """Write the three served graphs and the alphabet into `out`; returns the artifact's facts. Every target serves
    these ONNX graphs (`formats` is always {"onnx"}: targets.OCR_FORMATS)."""
    sources = {name: _checkpoint_file(location, file) for name, file in (
        (DETECTOR, spec.detector), (CLASSIFIER, spec.classifier), (RECOGNIZER, spec.recognizer),
    )}
    _save(_served(sources[DETECTOR], {0: "probability"}), out / DETECTOR)
    _save(_served(sources[CLASSIFIER], {0: "probabilities"}), out / CLASSIFIER)
    recognizer = onnx.load(str(sources[RECOGNIZER]))
    characters = {p.key: p.value for p in recognizer.metadata_props}.get("character")
    if characters is None:
        raise ExportMismatchError(f"{spec.recognizer}: the recogniser carries no dictionary ('character' metadata)")
    _save(_with_best_class(_served(sources[RECOGNIZER], {}), space_class=len(characters.splitlines()) + 1), out / RECOGNIZER)
    (out / ALPHABET).write_text(json.dumps(characters.splitlines(), ensure_ascii=False), encoding="utf-8")
    lines = check_against_originals(sources, out, spec.reading)
    log(f"  ocr: the exported graphs match the originals; the check page read back as {lines}")
    return {
        "detector_file": DETECTOR,
        "classifier_file": CLASSIFIER,
        "recognizer_file": RECOGNIZER,
        "alphabet_file": ALPHABET,
        "classes": len(characters.splitlines()) + 2,
        "reading": _reading_facts(spec.reading),
    }


def _reading_facts(settings: ocr.OcrSettings) -> dict:
    from dataclasses import asdict

    return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(settings).items()}


def _checkpoint_file(location: str, name: str) -> Path:
    """A file of the checkpoint: inside a local folder, or fetched from a Hugging Face repository id."""
    folder = Path(location)
    if folder.is_dir():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"the OCR checkpoint {folder} has no {name}")
        return path
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(location, name))


def _served(path: Path, outputs: dict[int, str]) -> onnx.ModelProto:
    """The graph with its input named `image`, outputs renamed as `outputs` says, initializers no longer listed as
    inputs (Paddle's older exports list them; Triton's onnxruntime backend would take them for inputs)."""
    model = onnx.load(str(path))
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != 1:
        raise ExportMismatchError(f"{path.name}: expected one image input, found {[i.name for i in inputs]}")
    renames = {inputs[0].name: INPUT, **{graph.output[index].name: name for index, name in outputs.items()}}
    del graph.input[:]
    graph.input.extend(inputs)
    for value in list(graph.input) + list(graph.output):
        value.name = renames.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    if model.ir_version < 4:
        model.ir_version = 4  # initializers that are not inputs need IR 4
    return model


def _with_best_class(model: onnx.ModelProto, space_class: int) -> onnx.ModelProto:
    """The recogniser's softmax [n, T, classes] replaced as outputs by its argmax (INT32 `classes`), max
    (`probabilities`) and the space class's column (`space_probability`), each [n, T]."""
    graph = model.graph
    softmax = graph.output[0].name
    classes = graph.output[0].type.tensor_type.shape.dim[2].dim_value
    if classes and classes != space_class + 1:
        raise ExportMismatchError(f"the recogniser has {classes} classes; its dictionary makes {space_class + 1}")
    graph.initializer.append(helper.make_tensor("space_class", TensorProto.INT64, [], [space_class]))
    graph.node.extend([
        helper.make_node("ArgMax", [softmax], ["best_class_int64"], axis=2, keepdims=0, name="best_class"),
        helper.make_node("Cast", ["best_class_int64"], ["classes"], to=TensorProto.INT32, name="best_class_int32"),
        helper.make_node("ReduceMax", [softmax], ["probabilities"], axes=[2], keepdims=0, name="best_probability"),
        helper.make_node("Gather", [softmax, "space_class"], ["space_probability"], axis=2, name="space_column"),
    ])
    del graph.output[:]
    graph.output.extend([
        helper.make_tensor_value_info("classes", TensorProto.INT32, ["batch", "columns"]),
        helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", "columns"]),
        helper.make_tensor_value_info("space_probability", TensorProto.FLOAT, ["batch", "columns"]),
    ])
    return model


def _save(model: onnx.ModelProto, path: Path) -> None:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


# ---------------------------------------------------------------- checks against the originals


def sample_page(mixed: bool = True, width: int = 900, height: int = 420) -> np.ndarray:
    """A white BGR page with SAMPLE_LINES drawn in Pillow's own scalable font (no system font needed); `mixed`: the
    last line upside down, so the classifier's 180-degree verdict shows in its outputs."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=34)
    for row, line in enumerate(SAMPLE_LINES[:-1] if mixed else SAMPLE_LINES):
        draw.text((40, 40 + row * 90 + (40 if row == 2 else 0)), line, fill="black", font=font)
    if mixed:
        upside = Image.new("RGB", (width - 80, 70), "white")
        ImageDraw.Draw(upside).text((10, 10), SAMPLE_LINES[-1], fill="black", font=font)
        page.paste(upside.rotate(180), (40, 40 + 2 * 90 + 40))
    return np.ascontiguousarray(np.asarray(page)[:, :, ::-1])


def check_against_originals(sources: dict[str, Path], out: Path, settings: ocr.OcrSettings) -> list[str]:
    """Run each served graph beside its original on the sample page; raise ExportMismatchError on a difference or
    when the pipeline does not read the sample's words back. Returns the lines read."""
    page = sample_page()
    det_input = ocr.detection_input(page, settings.detection_min_side, settings.max_side)[None]
    original_map = _run(sources[DETECTOR], det_input)[0]
    served_map = session(out / DETECTOR).run(["probability"], {INPUT: det_input})[0]
    check_close("ocr detector", original_map, served_map, atol=1e-5)

    boxes, _ = ocr.boxes_from_probability(original_map[0, 0], page.shape[1], page.shape[0], settings)
    boxes = ocr.usable_boxes(boxes, page.shape[1], page.shape[0])
    if len(boxes) < len(SAMPLE_LINES):
        raise ExportMismatchError(f"ocr detector: found {len(boxes)} boxes on the check page of {len(SAMPLE_LINES)} lines")
    crops = [ocr.crop_line(page, box) for box in boxes]
    cls_input = np.stack([ocr.classifier_input(crop) for crop in crops])
    check_close(
        "ocr classifier", _run(sources[CLASSIFIER], cls_input)[0],
        session(out / CLASSIFIER).run(["probabilities"], {INPUT: cls_input})[0], atol=1e-5,
    )
    width = max(ocr.recognizer_width(crop, settings.recognizer_widths) for crop in crops)
    rec_input = np.stack([ocr.recognizer_input(crop, width) for crop in crops])
    softmax = _run(sources[RECOGNIZER], rec_input)[0]
    classes, probabilities, space = session(out / RECOGNIZER).run(RECOGNIZER_OUTPUTS, {INPUT: rec_input})
    if not np.array_equal(classes, softmax.argmax(axis=2).astype(np.int32)):
        raise ExportMismatchError("ocr recognizer: the served classes are not the original's argmax")
    check_close("ocr recognizer", softmax.max(axis=2), probabilities, atol=1e-6)
    check_close("ocr recognizer's space", softmax[:, :, -1], space, atol=1e-6)

    upright = sample_page(mixed=False)
    for what, image in (("upright", upright), ("upside down", np.ascontiguousarray(upright[::-1, ::-1]))):
        lines = read_with_sessions(image, out, settings)
        text = " ".join(line.text for line in lines).casefold()
        missing = [word for word in SAMPLE_WORDS if word not in text]
        if missing:
            raise ExportMismatchError(f"ocr: the {what} check page read back as {[line.text for line in lines]}, without {missing}")
    return [line.text for line in lines]


def read_with_sessions(image: np.ndarray, folder: Path, settings: ocr.OcrSettings) -> list[ocr.OcrLine]:
    """The served pipeline over the exported graphs in this process (onnxruntime), as Triton would run it."""
    detector, classifier, recognizer = (session(folder / name) for name in (DETECTOR, CLASSIFIER, RECOGNIZER))
    alphabet = ocr.alphabet_of(json.loads((folder / ALPHABET).read_text(encoding="utf-8")))

    async def detect(batch: np.ndarray) -> np.ndarray:
        return detector.run(["probability"], {INPUT: batch})[0]

    async def classify(batch: np.ndarray) -> np.ndarray:
        return classifier.run(["probabilities"], {INPUT: batch})[0]

    async def recognize(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        classes, probabilities, space = recognizer.run(RECOGNIZER_OUTPUTS, {INPUT: batch})
        return classes, probabilities, space

    networks = ocr.Networks(detect, classify, recognize, batch=16)
    return asyncio.run(ocr.read_image(image, networks, alphabet, settings))


def _run(path: Path, image: np.ndarray) -> list[np.ndarray]:
    original = session(path)
    return original.run(None, {original.get_inputs()[0].name: image})
