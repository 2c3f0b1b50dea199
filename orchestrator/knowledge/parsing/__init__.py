"""Documents in: PDF checks and renders, MinerU and its content lists, OCR of image-only pages, text
sources, then blocks cut into passages, chunks and answer sentences."""
