"""The encoder ensembles' tokenizer step: padding to the longest text, or to fixed buckets for native backends."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from thinkserve_backend.tokenization import bucket_width, encode


@pytest.fixture
def tokenizer() -> Tokenizer:
    vocabulary = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(600)}}
    built = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    built.pre_tokenizer = pre_tokenizers.Whitespace()
    built.enable_truncation(300)
    return built


def words(count: int) -> str:
    return " ".join(f"w{i}" for i in range(count))


@pytest.mark.parametrize("longest, width", [(1, 16), (16, 16), (17, 32), (100, 128), (200, 256), (290, 300)])
def test_a_batch_is_padded_to_the_smallest_bucket_that_holds_its_longest_text(tokenizer, longest, width):
    arrays = encode(tokenizer, [words(3), words(longest)], buckets=(16, 32, 64, 128, 256, 512))
    assert arrays["input_ids"].shape == (2, width)  # past the largest bucket under max_length: max_length (300)
    assert arrays["attention_mask"][1].sum() == longest and arrays["attention_mask"][0].sum() == 3
    assert (arrays["input_ids"][0, 3:] == 0).all()


def test_without_buckets_a_batch_is_padded_to_its_longest_text(tokenizer):
    assert encode(tokenizer, [words(3), words(21)])["input_ids"].shape == (2, 21)


def test_bucket_width_is_capped_at_the_models_max_length():
    assert bucket_width(20, (16, 32, 64), max_length=24) == 24
    assert bucket_width(70, (16, 32, 64), max_length=256) == 256
