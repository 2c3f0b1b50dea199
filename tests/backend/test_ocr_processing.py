"""OCR's image work (thinkserve_backend.ocr) against the reference implementation it follows: rapidocr_onnxruntime
1.4.4's own pre- and post-processing, on the same inputs. And the exported graphs (thinkserve_build.ocr_export)
against the originals, through the served pipeline."""

from __future__ import annotations

import asyncio
import io
import json

import cv2
import numpy as np
import pytest
from PIL import Image
from rapidocr_onnxruntime.ch_ppocr_cls.text_cls import TextClassifier
from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess, DetPreProcess
from rapidocr_onnxruntime.ch_ppocr_rec.text_recognize import TextRecognizer
from rapidocr_onnxruntime.ch_ppocr_rec.utils import CTCLabelDecode
from rapidocr_onnxruntime.main import RapidOCR
from thinkserve_backend import ocr

from thinkserve_build import checkpoints, ocr_export, profiles

SETTINGS = ocr.OcrSettings()


def _blobs(seed: int, height: int = 320, width: int = 480) -> np.ndarray:
    """A detector-like probability map: soft rotated text kernels of many sizes on low noise."""
    rng = np.random.default_rng(seed)
    canvas = (rng.random((height, width)) * 0.2).astype(np.float32)
    for _ in range(25):
        centre = (float(rng.uniform(0, width)), float(rng.uniform(0, height)))
        size = (float(rng.uniform(4, 160)), float(rng.uniform(2, 24)))
        corners = cv2.boxPoints((centre, size, float(rng.uniform(-30, 30)))).astype(np.int32)
        cv2.fillPoly(canvas, [corners], float(rng.uniform(0.35, 1.0)))
    return cv2.GaussianBlur(canvas, (3, 3), 0)


@pytest.mark.parametrize("seed", range(6))
def test_box_post_processing_equals_the_reference(seed):
    probability = _blobs(seed)
    reference = DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=1000, unclip_ratio=1.6, use_dilation=True)
    expected, expected_scores = reference(probability[None, None], (640, 960))
    boxes, scores = ocr.boxes_from_probability(probability, 960, 640, SETTINGS)
    assert len(expected) >= 3
    assert np.array_equal(boxes, expected.reshape(-1, 4, 2))
    assert np.allclose(scores, expected_scores)


def test_box_post_processing_on_a_real_detector_map():
    page = ocr_export.sample_page()
    detector = _session("ch_PP-OCRv4_det_infer.onnx")
    reference_input = DetPreProcess(736, "min", [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])(page)
    ours = ocr.detection_input(page, 736, 2000)[None]
    assert np.allclose(ours, reference_input, atol=1e-6)
    probability = detector.run(None, {"x": ours})[0]
    expected, _ = DBPostProcess(0.3, 0.5, 1000, 1.6, use_dilation=True)(probability, page.shape[:2])
    boxes, _ = ocr.boxes_from_probability(probability[0, 0], page.shape[1], page.shape[0], SETTINGS)
    assert len(boxes) == len(ocr_export.SAMPLE_LINES) and np.array_equal(boxes, expected)


def test_box_order_crops_and_network_inputs_equal_the_reference():
    page = ocr_export.sample_page()
    engine = RapidOCR()
    raw, _ = engine.text_det(page)
    boxes = ocr.usable_boxes(raw.astype(np.float32), page.shape[1], page.shape[0])
    reference_order = engine.sorted_boxes(raw)
    ordered = boxes[ocr.reading_order(boxes)]
    assert np.array_equal(ordered, np.array(reference_order))
    crops = [ocr.crop_line(page, box) for box in ordered]
    reference_crops = engine.get_crop_img_list(page, reference_order)
    assert all(np.array_equal(a, b) for a, b in zip(crops, reference_crops))

    classifier = TextClassifier({**_config("Cls"), "model_path": str(_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"))})
    for crop in crops:
        assert np.allclose(ocr.classifier_input(crop), classifier.resize_norm_img(crop), atol=1e-6)
    recognizer = TextRecognizer({**_config("Rec"), "model_path": str(_model("ch_PP-OCRv4_rec_infer.onnx"))})
    for crop in crops:
        width = ocr.recognizer_width(crop, SETTINGS.recognizer_widths)
        expected = recognizer.resize_norm_img(crop, width / ocr.RECOGNIZER_HEIGHT)
        assert width in SETTINGS.recognizer_widths and np.allclose(ocr.recognizer_input(crop, width), expected, atol=1e-6)


def test_ctc_decoding_equals_the_reference_without_the_space_rule():
    alphabet_lines = ["a", "b", "c", "1", "%"]
    reference = CTCLabelDecode(character=list(alphabet_lines))
    alphabet = ocr.alphabet_of(alphabet_lines)
    assert alphabet[1:] == reference.character[1:] and len(alphabet) == len(reference.character)
    rng = np.random.default_rng(3)
    for _ in range(50):
        columns = int(rng.integers(1, 40))
        probabilities = rng.random((1, columns, len(alphabet))).astype(np.float32)
        probabilities[0, :, 0] *= rng.uniform(0, 4)  # blanks more or less frequent
        probabilities /= probabilities.sum(axis=2, keepdims=True)
        [(text, confidence)] = reference(probabilities)
        got = ocr.ctc_decode(probabilities.argmax(2)[0], probabilities.max(2)[0], probabilities[0, :, -1], alphabet, 0.0)
        assert got[0] == text and got[1] == pytest.approx(confidence)


def test_a_space_goes_where_the_recogniser_gave_it_probability_between_two_characters():
    alphabet = ocr.alphabet_of(list("abcdefghijklmnopqrstuvwxyz"))
    index = {c: i for i, c in enumerate(alphabet)}
    # "data" then blank columns then "into": a space column weakly probable (0.03) inside the gap
    classes = np.array([
        index["d"], 0, index["a"], 0, index["t"], 0, index["a"], 0, 0, 0, index["i"], 0, index["n"], 0, index["t"], 0, index["o"],
    ])
    probabilities = np.full(classes.shape, 0.9, np.float32)
    space = np.full(classes.shape, 0.0005, np.float32)
    space[8] = 0.03
    assert ocr.ctc_decode(classes, probabilities, space, alphabet, 0.01)[0] == "data into"
    assert ocr.ctc_decode(classes, probabilities, space, alphabet, 0.05)[0] == "datainto"
    assert ocr.ctc_decode(classes, probabilities, space, alphabet, 0.0)[0] == "datainto"
    # a space the model decoded itself is kept once, never doubled
    classes[8] = len(alphabet) - 1
    space[8] = 0.9
    assert ocr.ctc_decode(classes, probabilities, space, alphabet, 0.01)[0] == "data into"
    assert ocr.ctc_decode(np.zeros(5, np.int32), probabilities[:5], space[:5], alphabet, 0.01) == ("", 0.0)


def test_digits_are_split_only_where_the_space_is_likely():
    alphabet = ocr.alphabet_of(list("0123456789"))
    classes = np.array([alphabet.index("4"), 0, 0, alphabet.index("1"), 0, alphabet.index("2")])
    probabilities = np.full(classes.shape, 0.9, np.float32)
    space = np.array([0.0, 0.2, 0.0, 0.0, 0.0, 0.0], np.float32)
    assert ocr.ctc_decode(classes, probabilities, space, alphabet, 0.01, 0.5)[0] == "412"
    space[1] = 0.7
    assert ocr.ctc_decode(classes, probabilities, space, alphabet, 0.01, 0.5)[0] == "4 12"


def test_images_are_decoded_upright_and_bounded():
    page = ocr_export.sample_page()
    assert np.array_equal(ocr.decode_image(_encoded(page, "PNG"), 10**8), page)
    rotated = Image.fromarray(page[:, :, ::-1])
    exif = rotated.getexif()
    exif[0x0112] = 3  # orientation: rotated 180 degrees
    buffer = io.BytesIO()
    rotated.rotate(180).save(buffer, format="JPEG", quality=95, exif=exif)
    upright = ocr.decode_image(buffer.getvalue(), 10**8)
    assert upright.shape == page.shape and np.abs(upright.astype(int) - page.astype(int)).mean() < 8
    with pytest.raises(ValueError, match="at most"):
        ocr.decode_image(_encoded(page, "PNG"), 1000)
    with pytest.raises(ValueError, match="not a readable image"):
        ocr.decode_image(b"%PDF-1.7 not an image", 10**8)
    # a 24 MP photo of a page: its JPEG decoded at half scale, still covering 2,000 pixels
    photo = io.BytesIO()
    Image.new("RGB", (6000, 4000), "white").save(photo, format="JPEG")
    assert ocr.decode_image(photo.getvalue(), 10**7, max_side=2000).shape == (2000, 3000, 3)
    with pytest.raises(ValueError, match="6000 x 4000 pixels"):
        ocr.decode_image(photo.getvalue(), 10**7)
    big = np.zeros((50, 5000, 3), np.uint8)
    bounded, scale = ocr.bounded(big, 2000)
    assert bounded.shape[:2] == (20, 2000) and scale == pytest.approx(0.4)
    strip = ocr.detection_input(bounded, 736, 2000)  # a thin strip is not enlarged past max_side
    assert strip.shape[1] == 32 and strip.shape[2] <= ocr.detection_limit(2000)


def test_the_served_pipeline_reads_what_rapidocr_reads(tmp_path):
    """The exported graphs, run by the served pipeline's code, read the sample page as RapidOCR itself does (the
    space rule off and each line turned on its own verdict, as the reference reads)."""
    spec = profiles.tiny().ocr
    ocr_export.export_ocr(str(checkpoints.package_folder(spec.checkpoint)), spec, tmp_path, log=lambda _: None)
    assert json.loads((tmp_path / ocr_export.ALPHABET).read_text(encoding="utf-8"))[:3] == _alphabet_head()
    page = ocr_export.sample_page()
    ours = ocr_export.read_with_sessions(page, tmp_path, ocr.OcrSettings(space_threshold=0.0, orientation="line"))
    reference, _ = RapidOCR()(page)
    assert [line.text for line in ours] == [text for _, text, _ in reference]
    for line, (box, _, score) in zip(ours, reference):
        # the reference pads a batch of crops to its widest, ours each crop to its width bucket: the recogniser's
        # probabilities move a little with the padding it sees, the text does not
        assert np.allclose(line.quad, np.array(box), atol=1.0) and line.confidence == pytest.approx(score, abs=0.05)


def _alphabet_head() -> list[str]:
    return _session("ch_PP-OCRv4_rec_infer.onnx").get_modelmeta().custom_metadata_map["character"].splitlines()[:3]


def _encoded(bgr: np.ndarray, kind: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(bgr[:, :, ::-1]).save(buffer, format=kind)
    return buffer.getvalue()


def _model(name: str):
    return checkpoints.package_folder(profiles.PP_OCR_V4) / name


def _session(name: str):
    from thinkserve_build.onnx_tools import session

    return session(_model(name))


def _config(section: str) -> dict:
    import yaml

    return yaml.safe_load((checkpoints.package_folder(profiles.PP_OCR_V4).parent / "config.yaml").read_text())[section]


def test_a_page_turns_upside_down_as_a_whole_and_vertical_lines_each_on_their_own():
    crops = [np.zeros((48, width, 3), np.uint8) for width in (960, 480, 200, 48)]
    vertical = [False, False, False, True]
    upright, turned = [0.99, 0.01], [0.03, 0.97]
    settings = ocr.OcrSettings()
    # the two narrow lines wrongly say upside down: the line holding most of the text outvotes them
    votes = np.array([upright, turned, turned, turned])
    assert ocr.upside_down(votes, crops, vertical, settings) == [3]
    assert ocr.upside_down(votes, crops, vertical, ocr.OcrSettings(orientation="line")) == [1, 2, 3]
    # most of the text upside down: every horizontal line is turned
    votes = np.array([turned, turned, upright, upright])
    assert ocr.upside_down(votes, crops, vertical, settings) == [0, 1, 2]
    # an unsure verdict (below rotated_threshold) is no vote
    assert ocr.upside_down(np.array([[0.2, 0.8]] * 4), crops, vertical, settings) == []


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ocr-graphs")
    spec = profiles.tiny().ocr
    ocr_export.export_ocr(str(checkpoints.package_folder(spec.checkpoint)), spec, folder, log=lambda _: None)
    return folder


def test_lines_recognised_in_batches_read_as_each_line_alone(exported):
    """Crops of many widths, padded to their width buckets and recognised 16 at a time (as Triton's batcher merges
    the lines of pages in flight), read exactly as each crop recognised alone."""
    from PIL import ImageDraw, ImageFont

    from thinkserve_build.onnx_tools import session

    page = Image.new("RGB", (1400, 900), "white")
    draw = ImageDraw.Draw(page)
    words = ["12", "Revenue", "Operating income", "Quarterly shipments rose 12%", "Table 3: Operating income by region 2024",
             "The Aarhus warehouse passed its fire inspection on 14 March", "$4.2", "Q3", "Lyon, Porto and Gdansk"]
    for row, text in enumerate(words):
        draw.text((40, 30 + 95 * row), text, fill="black", font=ImageFont.load_default(size=30 + 4 * (row % 3)))
    image = np.ascontiguousarray(np.asarray(page)[:, :, ::-1])
    boxes = ocr.usable_boxes(*_boxes_of(image, exported))
    crops = [ocr.crop_line(image, box) for box in boxes[ocr.reading_order(boxes)]]
    widths = {ocr.recognizer_width(crop, SETTINGS.recognizer_widths) for crop in crops}
    assert len(crops) == len(words) and len(widths) >= 4  # several buckets, several lines in some
    recognizer = session(exported / ocr_export.RECOGNIZER)
    alphabet = ocr.alphabet_of(json.loads((exported / ocr_export.ALPHABET).read_text(encoding="utf-8")))
    sizes: list[int] = []

    async def recognize(batch):
        sizes.append(len(batch))
        classes, probabilities, space = recognizer.run(ocr_export.RECOGNIZER_OUTPUTS, {"image": batch})
        return classes, probabilities, space

    def read(batch: int) -> list[tuple[str, float]]:
        networks = ocr.Networks(None, None, recognize, batch)
        return asyncio.run(ocr.recognize_crops(crops, networks, alphabet, SETTINGS))

    together = read(16)
    assert max(sizes) > 1
    sizes.clear()
    alone = read(1)
    assert set(sizes) == {1}
    assert [text for text, _ in together] == [text for text, _ in alone] == words
    assert np.allclose([c for _, c in together], [c for _, c in alone], atol=1e-5)


def _boxes_of(image: np.ndarray, folder) -> tuple[np.ndarray, int, int]:
    from thinkserve_build.onnx_tools import session

    detector = session(folder / ocr_export.DETECTOR)
    height, width = image.shape[:2]
    probability = detector.run(["probability"], {"image": ocr.detection_input(image, SETTINGS.detection_min_side, SETTINGS.max_side)[None]})[0]
    boxes, _ = ocr.boxes_from_probability(probability[0, 0], width, height, SETTINGS)
    return boxes, width, height
