"""Query pipeline: question -> retrieval -> prompt -> streamed answer with evidence, citations and timings."""
