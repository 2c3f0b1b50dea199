"""Token choice: greedy, nucleus sampling (exact), and the confidence figures reported with each token."""

import numpy as np
import pytest

from thinkserve_backend.sampling import choose_token, log_softmax


def test_greedy_takes_the_argmax_and_reports_its_log_probability():
    logits = np.array([0.5, 3.0, -1.0, 2.0], dtype=np.float32)
    choice = choose_token(logits, temperature=0.0, top_p=1.0, rng=np.random.default_rng(0))
    assert choice.token_id == 1
    assert choice.log_prob == pytest.approx(float(log_softmax(logits)[1]))


def test_entropy_is_normalised_between_zero_and_one():
    uniform = choose_token(np.zeros(50, dtype=np.float32), 0.0, 1.0, np.random.default_rng(0))
    peaked = choose_token(np.array([100.0] + [0.0] * 49, dtype=np.float32), 0.0, 1.0, np.random.default_rng(0))
    assert uniform.normalized_entropy == pytest.approx(1.0, abs=1e-6)
    assert peaked.normalized_entropy == pytest.approx(0.0, abs=1e-6)


def test_sampling_is_reproducible_with_a_seed():
    logits = np.random.default_rng(1).normal(size=300).astype(np.float32)
    first = [choose_token(logits, 1.0, 0.9, rng).token_id for rng in [np.random.default_rng(7)] for _ in range(20)]
    second = [choose_token(logits, 1.0, 0.9, rng).token_id for rng in [np.random.default_rng(7)] for _ in range(20)]
    assert first == second


def nucleus(probs: np.ndarray, top_p: float) -> set[int]:
    order = np.argsort(-probs, kind="stable")
    keep, total = [], 0.0
    for token in order:
        keep.append(int(token))
        total += probs[token]
        if total >= top_p:
            break
    return set(keep)


@pytest.mark.parametrize("vocab", [40, 5000])  # below and above the candidate shortcut
def test_top_p_samples_only_from_the_exact_nucleus(vocab):
    logits = np.random.default_rng(vocab).normal(scale=3.0, size=vocab).astype(np.float32)
    probs = np.exp(log_softmax(logits))
    allowed = nucleus(probs, 0.8)
    rng = np.random.default_rng(0)
    drawn = {choose_token(logits, 1.0, 0.8, rng).token_id for _ in range(400)}
    assert drawn <= allowed
    assert len(drawn) > 1


def test_top_p_falls_back_to_the_whole_vocabulary_when_the_candidates_are_not_enough():
    # Flat logits: the first 1024 candidates hold a third of the mass, so the nucleus (top_p just above 0.9,
    # clear of float rounding at the boundary) is the first 2701 tokens in stable order. More than 1024
    # distinct draws prove the fallback to the whole vocabulary happened.
    logits = np.zeros(3000, dtype=np.float32)
    rng = np.random.default_rng(3)
    drawn = {choose_token(logits, 1.0, 0.9001, rng).token_id for _ in range(3000)}
    assert len(drawn) > 1024
    assert max(drawn) <= 2700


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9), (1.3, 0.5)])
def test_the_device_chooser_draws_the_host_choosers_tokens_and_measures(temperature, top_p):
    """The torch target chooses where its logits lie (torch_decoding.DeviceLogits): from the same seed it must draw
    what the ONNX target's numpy chooser draws, with the same log-probability and entropy, and move only the
    three measures to the host."""
    torch = pytest.importorskip("torch")
    from thinkserve_backend.torch_decoding import MEASURES_PER_TOKEN, DeviceLogits

    vocab = 5000
    host_rng, device_rng = np.random.default_rng(11), np.random.default_rng(11)
    for step in range(60):
        logits = np.random.default_rng(step).normal(scale=2.5, size=vocab).astype(np.float32)
        expected = choose_token(logits, temperature, top_p, host_rng)
        on_device = DeviceLogits(torch.from_numpy(logits))
        actual = choose_token(on_device, temperature, top_p, device_rng)
        assert actual.token_id == expected.token_id, f"step {step}"
        assert actual.log_prob == pytest.approx(expected.log_prob, abs=1e-9)
        assert actual.normalized_entropy == pytest.approx(expected.normalized_entropy, abs=1e-9)
        assert on_device.host_bytes == MEASURES_PER_TOKEN * 8 < logits.nbytes
