"""Token counts as a model counts them: its own tokenizer.json, read from the model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer

from ..errors import ConfigurationError


class PlainTokenizer:
    """A model's tokenizer without the padding and truncation baked into its tokenizer.json (MiniLM's pads and
    truncates to 128): chunk sizes and prompt budgets need the true length of any text."""

    def __init__(self, path: Path, setting: str):
        if not Path(path).is_file():
            raise ConfigurationError(
                f"tokenizer file {path} not found: set {setting} to the model's tokenizer.json "
                "(built by `make models` into the model repository)"
            )
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()

    def encode(self, texts: Sequence[str]):
        return self._tokenizer.encode_batch(list(texts), add_special_tokens=False)

    def total(self, texts: Sequence[str]) -> int:
        """Tokens of all the texts together (no offsets computed: the fast batch encoder)."""
        return sum(self.counts(texts))

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text (the fast batch encoder)."""
        if not texts:
            return []
        return [len(encoding.ids) for encoding in self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)
