"""How OCR reads a page, and the networks' fixed input sizes: what the model compiler, the served pipeline and the
build's checks share. Free of OpenCV (thinkserve_backend.ocr needs it), so a build without the OCR role (a machine
without OpenCV: `thinkserve-build --no-ocr`) imports nothing it lacks."""

from __future__ import annotations

import math
from dataclasses import dataclass

# What every network reads: (pixel / 255 - 0.5) / 0.5, channels first.
DETECTION_MULTIPLE = 32  # the detector's input sides are multiples of its stride
CLASSIFIER_SHAPE = (48, 192)  # height, width of the 0/180 classifier's input
RECOGNIZER_HEIGHT = 48
ROTATED_LABEL = 1  # the classifier's labels: 0 degrees, 180 degrees


@dataclass(frozen=True)
class OcrSettings:
    """How pages are read. The defaults are RapidOCR's (config.yaml of rapidocr_onnxruntime 1.4.4) unless noted."""

    max_side: int = 2000  # the long side of the image the boxes are found and cropped in (larger ones are shrunk)
    detection_min_side: int = 736  # the detector's input is enlarged until its short side is at least this
    binary_threshold: float = 0.3  # a pixel of the probability map is text above this
    box_threshold: float = 0.5  # a box is kept when its mean probability is at least this
    max_candidates: int = 1000
    unclip_ratio: float = 1.6  # how far a box grows past the shrunk text kernel the detector marks
    dilation: bool = True
    rotated_threshold: float = 0.9  # a line votes "upside down" when the classifier says so this surely
    # "page": one verdict for a page's horizontal lines, upside down when lines holding most of its text vote so (a
    # scan fed in upside down); each vertical line (read a quarter turned) still on its own. "line": every line on
    # its own, as the reference. On 21 dev pages with a text layer the per-line verdict turned upright lines of
    # dense text upside down (9 of 43 lines of one 10-K page), which then read as garbage: without it the share of
    # words read rose from 94.2% to 98.6% and of characters inside a box from 95.6% to 99.8%.
    orientation: str = "page"
    # Recognition crops are padded to the smallest of these widths that holds them (Triton batches equal shapes);
    # the reference pads each batch to its widest crop, at least 320. A crop wider than the last is squeezed to it.
    # The recogniser's time grows with the columns it reads, padding included, and batching gains little on a CPU:
    # 320 for a 60-pixel word was five times its work. With steps of at most a quarter, on 16 dev pages with a text
    # layer (150 dpi, in process) the characters read were the same (error rate 1.69% against 1.70%, words found
    # 96.8% both) and recognition took 20% less time; on slides, whose lines are short, a third of it.
    recognizer_widths: tuple[int, ...] = (
        64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560,
    )
    # A space is put between two characters when, in a column from the first's last to the second's first, the
    # recogniser gave the space more than this probability (0: only where it decoded one, as the reference). Its
    # Chinese-English model leaves most spaces between English words undecoded: on 64 dev pages with a text layer
    # (150 dpi) 0.01 took the character error rate from 4.6% to 1.4% and whole-word recall from 65% to 92%;
    # thresholds 0.005-0.02 are within 0.1 points of it, while rules on column gaps reached 73% at best.
    space_threshold: float = 0.01
    # ... between two digits: a number split in two ("4 12") is a wrong answer; on the same pages 0.5 here changed
    # no character against 0.01
    digit_space_threshold: float = 0.5
    max_image_pixels: int = 100_000_000  # an encoded image with more pixels is refused (decompression bombs)


def detection_limit(max_side: int) -> int:
    """The largest side of a detector input made from an image of at most `max_side` pixels a side."""
    return max(DETECTION_MULTIPLE, math.ceil(max_side / DETECTION_MULTIPLE) * DETECTION_MULTIPLE)
