"""Incremental detokenisation: byte-level tokens that split characters, and stop strings split over tokens."""

from thinkserve_backend.text_stream import TextStream

# A byte-level vocabulary like a BPE's: "é" is two tokens (0xC3 0xA9), "ünd" splits its first character.
VOCAB = {1: b"Hel", 2: b"lo", 3: b" w", 4: b"orld", 5: b"\xc3", 6: b"\xa9", 7: b"<|", 8: b"im_end", 9: b"|>", 10: b" caf", 11: b"!"}


def decode(ids):
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


def run(ids, stop=()):
    stream = TextStream(decode, stop)
    pieces = [stream.push(i) for i in ids]
    return pieces, stream.finish(), stream.stopped


def test_pieces_concatenate_to_the_full_text():
    pieces, tail, _ = run([1, 2, 3, 4])
    assert "".join(pieces) + tail == "Hello world"


def test_a_split_utf8_character_is_held_until_complete():
    pieces, tail, _ = run([10, 5, 6, 11])
    assert pieces[1] == ""  # half of "é": nothing released yet
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + tail == " café!"


def test_stop_string_split_over_tokens_is_never_released():
    pieces, tail, stopped = run([1, 2, 7, 8, 9, 3, 4], stop=("<|im_end|>",))
    text = "".join(pieces) + tail
    assert text == "Hello"
    assert stopped
    assert all("<|" not in piece for piece in pieces)


def test_text_that_only_looks_like_a_stop_prefix_is_released_at_the_end():
    pieces, tail, stopped = run([1, 2, 7], stop=("<|im_end|>",))
    assert "".join(pieces) == "Hello"
    assert tail == "<|"
    assert not stopped


def test_nothing_is_released_after_a_stop():
    stream = TextStream(decode, ("lo",))
    assert stream.push(1) == "He"  # "Hel": the final "l" may begin the stop string "lo", so it is held
    assert stream.push(2) == "l"
    assert stream.stopped
    assert stream.push(3) == "" and stream.finish() == ""
