"""Text detection and recognition around PP-OCR's three networks: the image work before and after them.

PP-OCR's networks (DB text detection, a 0/180-degree line classifier, CTC recognition) read images prepared as
PaddleOCR prepares them, and their outputs mean something only after its post-processing: the detector's
probability map becomes boxes (threshold, contours, minimum-area rectangles, a polygon offset: "unclip"), each
box a perspective crop, and each line's per-column best class a string (CTC: repeats merged, blanks dropped).
This follows RapidOCR's implementation (rapidocr_onnxruntime 1.4.4, Apache-2.0) step for step; the unit tests
compare the two on the same inputs. What differs is said where it differs: crops of recognition are padded to a
few fixed widths (so requests batch), a space may be put where the recogniser left a word gap blank, and a page's
horizontal lines are turned upside down all or none (settings in ocr_settings.py, with what each was measured at).

Only numpy, OpenCV and pyclipper: it runs in Triton's model environment (and in the project's, for the tests).
Images are BGR uint8 arrays, as OpenCV and PaddleOCR's training read them.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import cv2
import numpy as np
import pyclipper

from .ocr_settings import CLASSIFIER_SHAPE, DETECTION_MULTIPLE, RECOGNIZER_HEIGHT, ROTATED_LABEL, OcrSettings, detection_limit

__all__ = ["CLASSIFIER_SHAPE", "RECOGNIZER_HEIGHT", "OcrLine", "OcrSettings", "detection_limit"]


@dataclass(frozen=True)
class OcrLine:
    """One recognised line: its text, its box's four corners (x, y in pixels of the decoded image: top-left,
    top-right, bottom-right, bottom-left) and the recogniser's confidence (mean probability of its characters)."""

    text: str
    quad: np.ndarray  # float32 [4, 2]
    confidence: float


# ---------------------------------------------------------------- images in


def decode_image(data: bytes, max_pixels: int, max_side: int = 0) -> np.ndarray:
    """Encoded PNG/JPEG/... bytes -> BGR uint8, upright (EXIF orientation applied). A JPEG is decoded at the
    smallest of 1/1, 1/2, 1/4, 1/8 scale that still covers `max_side` (its decoder does that for free). ValueError
    for bytes that are no image and for images over `max_pixels` as decoded (checked before decoding)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format == "JPEG" and max_side:
                image.draft("RGB", (max_side, max_side))
            width, height = image.size
            if width * height > max_pixels:
                raise ValueError(f"the image is {width} x {height} pixels; at most {max_pixels:,} are read")
            if width < 1 or height < 1:
                raise ValueError(f"the image is {width} x {height} pixels")
            image = ImageOps.exif_transpose(image)
            rgb = np.asarray(image.convert("RGB"))
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as error:
        raise ValueError(f"not a readable image ({error})") from None
    return np.ascontiguousarray(rgb[:, :, ::-1])


def bounded(image: np.ndarray, max_side: int) -> tuple[np.ndarray, float]:
    """The image with its long side at most `max_side` pixels, and the scale applied (1: unchanged)."""
    height, width = image.shape[:2]
    if max(height, width) <= max_side:
        return image, 1.0
    scale = max_side / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA), scale


def _normalized(image: np.ndarray) -> np.ndarray:
    """HWC uint8 -> CHW float32 in [-1, 1]."""
    return ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def detection_input(image: np.ndarray, min_side: int, max_side: int) -> np.ndarray:
    """The detector's input [3, H, W]: enlarged until the short side is `min_side` (RapidOCR's DetPreProcess with
    limit_type "min"), but the long side never past `max_side` (a thin strip would otherwise become a huge input),
    sides rounded to multiples of 32."""
    height, width = image.shape[:2]
    ratio = 1.0
    if min(height, width) < min_side:
        ratio = max(1.0, min(min_side / min(height, width), max_side / max(height, width)))
    resized_h = max(DETECTION_MULTIPLE, int(round(int(height * ratio) / DETECTION_MULTIPLE) * DETECTION_MULTIPLE))
    resized_w = max(DETECTION_MULTIPLE, int(round(int(width * ratio) / DETECTION_MULTIPLE) * DETECTION_MULTIPLE))
    return _normalized(cv2.resize(image, (resized_w, resized_h)))


# ---------------------------------------------------------------- detection: probability map -> boxes


def _mini_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The minimum-area rectangle of a contour as 4 corners (top-left, top-right, bottom-right, bottom-left) and
    its short side."""
    rectangle = cv2.minAreaRect(contour)
    points = sorted(list(cv2.boxPoints(rectangle)), key=lambda p: p[0])
    first, fourth = (0, 1) if points[1][1] > points[0][1] else (1, 0)
    second, third = (2, 3) if points[3][1] > points[2][1] else (3, 2)
    box = np.array([points[first], points[second], points[third], points[fourth]])
    return box, min(rectangle[1])


def _box_score(probability: np.ndarray, box: np.ndarray) -> float:
    """Mean probability inside the box ("fast" score: the rectangle's polygon, not the contour's)."""
    height, width = probability.shape
    x_min = int(np.clip(np.floor(box[:, 0].min()), 0, width - 1))
    x_max = int(np.clip(np.ceil(box[:, 0].max()), 0, width - 1))
    y_min = int(np.clip(np.floor(box[:, 1].min()), 0, height - 1))
    y_max = int(np.clip(np.ceil(box[:, 1].max()), 0, height - 1))
    mask = np.zeros((y_max - y_min + 1, x_max - x_min + 1), dtype=np.uint8)
    shifted = box - np.array([x_min, y_min], dtype=box.dtype)
    cv2.fillPoly(mask, shifted.reshape(1, -1, 2).astype(np.int32), 1)
    return cv2.mean(probability[y_min : y_max + 1, x_min : x_max + 1], mask)[0]


def unclip(box: np.ndarray, ratio: float) -> np.ndarray:
    """Grow the polygon by area * ratio / perimeter (DB's detector marks a shrunk kernel of each text region)."""
    x, y = box[:, 0].astype(np.float64), box[:, 1].astype(np.float64)
    area = 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))
    perimeter = float(np.sum(np.hypot(np.roll(x, -1) - x, np.roll(y, -1) - y)))
    offset = pyclipper.PyclipperOffset()
    offset.AddPath(box, pyclipper.JT_ROUND, pyclipper.ET_CLOSEDPOLYGON)
    return np.array(offset.Execute(area * ratio / perimeter if perimeter else 0.0)).reshape((-1, 1, 2))


def boxes_from_probability(
    probability: np.ndarray, width: int, height: int, settings: OcrSettings
) -> tuple[np.ndarray, list[float]]:
    """DB post-processing: the detector's map [h, w] -> boxes [n, 4, 2] (int32, in a `width` x `height` image)
    and their scores (RapidOCR's DBPostProcess, score mode "fast")."""
    map_h, map_w = probability.shape
    bitmap = (probability > settings.binary_threshold).astype(np.uint8)
    if settings.dilation:
        bitmap = cv2.dilate(bitmap, np.array([[1, 1], [1, 1]], dtype=np.uint8))
    contours, _ = cv2.findContours(bitmap * 255, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    boxes, scores = [], []
    min_size = 3
    for contour in contours[: settings.max_candidates]:
        points, short_side = _mini_box(contour)
        if short_side < min_size:
            continue
        score = _box_score(probability, points.reshape(-1, 2))
        if settings.box_threshold > score:
            continue
        box, short_side = _mini_box(unclip(points, settings.unclip_ratio))
        if short_side < min_size + 2:
            continue
        box[:, 0] = np.clip(np.round(box[:, 0] / map_w * width), 0, width)
        box[:, 1] = np.clip(np.round(box[:, 1] / map_h * height), 0, height)
        boxes.append(box.astype(np.int32))
        scores.append(score)
    return np.array(boxes, dtype=np.int32).reshape(-1, 4, 2), scores


def clockwise(points: np.ndarray) -> np.ndarray:
    """Four corners as top-left, top-right, bottom-right, bottom-left."""
    by_x = points[np.argsort(points[:, 0]), :]
    left, right = by_x[:2, :], by_x[2:, :]
    top_left, bottom_left = left[np.argsort(left[:, 1]), :]
    top_right, bottom_right = right[np.argsort(right[:, 1]), :]
    return np.array([top_left, top_right, bottom_right, bottom_left], dtype=np.float32)


def usable_boxes(boxes: np.ndarray, width: int, height: int) -> np.ndarray:
    """Boxes put in clockwise order, clipped to the image, those 3 pixels or less across dropped
    (TextDetector.filter_tag_det_res)."""
    kept = []
    for box in boxes:
        box = clockwise(box.astype(np.float32))
        box[:, 0] = np.clip(box[:, 0], 0, width - 1).astype(np.int32)
        box[:, 1] = np.clip(box[:, 1], 0, height - 1).astype(np.int32)
        if int(np.linalg.norm(box[0] - box[1])) <= 3 or int(np.linalg.norm(box[0] - box[3])) <= 3:
            continue
        kept.append(box)
    return np.array(kept, dtype=np.float32).reshape(-1, 4, 2)


def reading_order(boxes: np.ndarray, same_line_px: float = 10.0) -> list[int]:
    """Indices of the boxes top to bottom, left to right among boxes whose tops are within `same_line_px`
    (RapidOCR's sorted_boxes)."""
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][0][1], boxes[i][0][0]))
    for i in range(len(order) - 1):
        for j in range(i, -1, -1):
            upper, lower = boxes[order[j]], boxes[order[j + 1]]
            if abs(lower[0][1] - upper[0][1]) < same_line_px and lower[0][0] < upper[0][0]:
                order[j], order[j + 1] = order[j + 1], order[j]
            else:
                break
    return order


# ---------------------------------------------------------------- lines: crops, classifier and recogniser inputs


def _crop_size(points: np.ndarray) -> tuple[int, int]:
    width = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    height = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    return max(width, 1), max(height, 1)


def is_vertical(quad: np.ndarray) -> bool:
    """Whether crop_line reads the box a quarter turned (a crop 1.5 times taller than wide: vertical text)."""
    width, height = _crop_size(quad.astype(np.float32))
    return height / width >= 1.5


def crop_line(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The box's pixels straightened by a perspective warp; a crop 1.5 times taller than wide is turned a quarter
    (vertical text read sideways), as RapidOCR's get_rotate_crop_image."""
    points = quad.astype(np.float32)
    width, height = _crop_size(points)
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], dtype=np.float32)
    warped = cv2.warpPerspective(
        image, cv2.getPerspectiveTransform(points, target), (width, height),
        borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC,
    )
    if warped.shape[0] / warped.shape[1] >= 1.5:
        warped = np.rot90(warped)
    return warped


def _fitted(crop: np.ndarray, height: int, width: int) -> np.ndarray:
    """The crop resized to `height`, at most `width` wide, normalised and right-padded with zeros to `width`."""
    ratio = crop.shape[1] / float(crop.shape[0])
    resized_w = width if math.ceil(height * ratio) > width else int(math.ceil(height * ratio))
    out = np.zeros((3, height, width), dtype=np.float32)
    out[:, :, :resized_w] = _normalized(cv2.resize(crop, (resized_w, height)))
    return out


def classifier_input(crop: np.ndarray) -> np.ndarray:
    """[3, 48, 192]: the 0/180 classifier's input (TextClassifier.resize_norm_img)."""
    return _fitted(crop, *CLASSIFIER_SHAPE)


def recognizer_width(crop: np.ndarray, widths: Sequence[int]) -> int:
    """The padded width a crop is recognised at: the smallest of `widths` that holds it at height 48."""
    natural = math.ceil(RECOGNIZER_HEIGHT * crop.shape[1] / float(crop.shape[0]))
    return next((w for w in widths if natural <= w), widths[-1])


def recognizer_input(crop: np.ndarray, width: int) -> np.ndarray:
    """[3, 48, width] (TextRecognizer.resize_norm_img with the batch's width given)."""
    return _fitted(crop, RECOGNIZER_HEIGHT, width)


# ---------------------------------------------------------------- recognition: CTC -> text


def ctc_decode(
    classes: np.ndarray, probabilities: np.ndarray, space_probability: np.ndarray, alphabet: Sequence[str],
    space_threshold: float = 0.0, digit_space_threshold: float = 0.5,
) -> tuple[str, float]:
    """One line's best class, that class's probability and the space's probability per column -> (text, mean
    probability of the characters decoded).

    Greedy CTC as the reference decodes it: repeats merged, blanks (class 0) dropped; `alphabet[i]` is class i's
    character (alphabet[0] the blank, alphabet[-1] the space). The confidence counts decoded characters only (a
    line with none has 0). With `space_threshold` > 0, a space is also put between two decoded characters where a
    column from the first's last column to the second's first gave the space more than that probability
    (`digit_space_threshold` between two digits)."""
    classes = np.asarray(classes).reshape(-1)
    changes = np.ones(classes.shape, dtype=bool)
    changes[1:] = classes[1:] != classes[:-1]
    keep = changes & (classes != 0)
    starts = np.flatnonzero(keep)
    if starts.size == 0:
        return "", 0.0
    confidence = float(np.mean(np.asarray(probabilities).reshape(-1)[starts]))
    characters = [alphabet[c] for c in classes[starts]]
    if space_threshold <= 0 or starts.size < 2:
        return "".join(characters), confidence
    # each decoded character's run of columns ends where the next run (of any class) begins
    run_starts = np.flatnonzero(changes)
    ends = run_starts[np.searchsorted(run_starts, starts, side="right")[:-1]] - 1
    space = np.asarray(space_probability).reshape(-1)
    out = [characters[0]]
    for k in range(1, len(characters)):
        between = space[ends[k - 1] : starts[k] + 1]
        threshold = digit_space_threshold if out[-1].isdigit() and characters[k].isdigit() else space_threshold
        if between.size and float(between.max()) > threshold and not out[-1].isspace() and not characters[k].isspace():
            out.append(" ")
        out.append(characters[k])
    return "".join(out), confidence


# ---------------------------------------------------------------- the whole page, over any runtime of the networks

# Each network as an async call on a batch: detect([1, 3, H, W]) -> probability [1, 1, H, W]; classify([n, 3, 48,
# 192]) -> probabilities [n, 2]; recognize([n, 3, 48, W]) -> (classes, probabilities, space_probability) [n, T] each.
Detect = Callable[[np.ndarray], Awaitable[np.ndarray]]
Classify = Callable[[np.ndarray], Awaitable[np.ndarray]]
Recognize = Callable[[np.ndarray], Awaitable[tuple[np.ndarray, np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class Networks:
    detect: Detect
    classify: Classify
    recognize: Recognize
    batch: int  # rows per classifier / recogniser call


async def read_image(image: np.ndarray, networks: Networks, alphabet: Sequence[str], settings: OcrSettings) -> list[OcrLine]:
    """Every text line of a BGR image, in reading order, with boxes in the image's pixels."""
    import asyncio

    working, scale = bounded(image, settings.max_side)
    height, width = working.shape[:2]
    probability = (await networks.detect(detection_input(working, settings.detection_min_side, settings.max_side)[None]))[0, 0]
    boxes, _ = boxes_from_probability(probability, width, height, settings)
    boxes = usable_boxes(boxes, width, height)
    if not len(boxes):
        return []
    boxes = boxes[reading_order(boxes)]
    crops = [crop_line(working, box) for box in boxes]

    rows = [classifier_input(crop) for crop in crops]
    verdicts = await asyncio.gather(*(
        networks.classify(np.stack(rows[i : i + networks.batch])) for i in range(0, len(rows), networks.batch)
    ))
    for i in upside_down(np.concatenate(verdicts), crops, [is_vertical(box) for box in boxes], settings):
        crops[i] = cv2.rotate(crops[i], cv2.ROTATE_180)

    texts = await recognize_crops(crops, networks, alphabet, settings)
    quads = boxes / scale
    return [OcrLine(text, quad, confidence) for (text, confidence), quad in zip(texts, quads)]


def upside_down(
    probabilities: np.ndarray, crops: Sequence[np.ndarray], vertical: Sequence[bool], settings: OcrSettings
) -> list[int]:
    """The lines to turn 180 degrees before recognition, from the classifier's [n, 2] probabilities: with
    orientation "line" each line it says is upside down; with "page" the page's horizontal lines all or none, as
    the lines holding most of their text (crop width) vote, and each vertical line by its own verdict."""
    votes = (probabilities.argmax(axis=1) == ROTATED_LABEL) & (probabilities.max(axis=1) > settings.rotated_threshold)
    if settings.orientation == "line":
        return [int(i) for i in np.flatnonzero(votes)]
    horizontal = [i for i in range(len(crops)) if not vertical[i]]
    weights = np.array([crops[i].shape[1] / crops[i].shape[0] for i in horizontal])
    page_turned = bool(horizontal) and float(weights[votes[horizontal]].sum()) > 0.5 * float(weights.sum())
    return sorted((horizontal if page_turned else []) + [i for i in range(len(crops)) if vertical[i] and votes[i]])


async def recognize_crops(
    crops: Sequence[np.ndarray], networks: Networks, alphabet: Sequence[str], settings: OcrSettings
) -> list[tuple[str, float]]:
    """(text, confidence) of each line crop: crops of one padded width are recognised together."""
    import asyncio

    widths = [recognizer_width(crop, settings.recognizer_widths) for crop in crops]
    groups: dict[int, list[int]] = {}
    for index, width in enumerate(widths):
        groups.setdefault(width, []).append(index)
    calls, members = [], []
    for width, indices in groups.items():
        for start in range(0, len(indices), networks.batch):
            chunk = indices[start : start + networks.batch]
            calls.append(networks.recognize(np.stack([recognizer_input(crops[i], width) for i in chunk])))
            members.append(chunk)
    results: list[tuple[str, float]] = [("", 0.0)] * len(crops)
    for chunk, (classes, probabilities, space) in zip(members, await asyncio.gather(*calls)):
        for row, index in enumerate(chunk):
            results[index] = ctc_decode(
                classes[row], probabilities[row], space[row], alphabet, settings.space_threshold, settings.digit_space_threshold
            )
    return results


def alphabet_of(characters: Sequence[str]) -> list[str]:
    """The recogniser's classes from its dictionary (the ONNX file's `character` metadata split into lines, as
    RapidOCR reads it): the CTC blank first, then the dictionary, then the space PaddleOCR appends."""
    return ["", *characters, " "]


def empty_quads() -> np.ndarray:
    return np.zeros((0, 4, 2), dtype=np.float32)


def as_arrays(lines: Sequence[OcrLine], image_width: int, image_height: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Texts, boxes [n, 4, 2] as fractions of the image's width and height, confidences [n]."""
    if not lines:
        return [], empty_quads(), np.zeros((0,), dtype=np.float32)
    quads = np.stack([line.quad for line in lines]).astype(np.float32)
    quads[:, :, 0] /= max(image_width, 1)
    quads[:, :, 1] /= max(image_height, 1)
    return [line.text for line in lines], np.clip(quads, 0.0, 1.0), np.array([line.confidence for line in lines], np.float32)
