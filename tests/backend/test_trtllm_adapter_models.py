"""The TensorRT-LLM adapter models' wiring (models/trtllm_adapter.py), against an engine replaying the recorded
responses (tests/backend/trtllm_recorded): what reaches the engine, what the client is sent, cancellation, errors.

No TensorRT-LLM runs anywhere here, and Triton's python API exists only inside its stub: this module gives the
adapter a stand-in of that API (`triton_python_backend_utils`), with a BLS call that plays a recording. The
recordings' shapes follow the backend's documented contract (see test_trtllm_adapter.py)."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from tests.backend.test_trtllm_adapter import EOS, RECORDED, VOCAB, VOCAB_SIZE, array, load

FINAL = 1


class Tensor:
    def __init__(self, name: str, value: np.ndarray):
        self._name, self._value = name, np.asarray(value)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._value

    def is_cpu(self) -> bool:
        return True


class TritonError:
    INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

    def __init__(self, message: str, code: str = INTERNAL):
        self._message, self.code = message, code

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.tensors, self.error_value = list(output_tensors), error

    def output_tensors(self):
        return self.tensors

    def has_error(self) -> bool:
        return self.error_value is not None

    def error(self):
        return self.error_value


class Engine:
    """The tensorrt_llm model: records each request's tensors and answers with a recording's responses."""

    def __init__(self, responses: list[dict], fail: str = ""):
        self.responses, self.fail = responses, fail
        self.requests: list[dict[str, np.ndarray]] = []
        self.outputs: list[list[str]] = []  # each request's requested output names
        self.cancelled = 0

    def stream(self, request):
        self.requests.append({tensor.name(): tensor.as_numpy() for tensor in request.inputs})
        self.outputs.append(list(request.requested_output_names))
        engine = self

        class Responses:
            def __iter__(self):
                if engine.fail:
                    yield InferenceResponse(error=TritonError(engine.fail))
                    return
                for outputs in engine.responses:
                    yield InferenceResponse([Tensor(name, value) for name, value in outputs.items()])

            def cancel(self):
                engine.cancelled += 1

        return Responses()


class Sender:
    def __init__(self, cancelled_after: int = -1):
        self.sent: list[tuple[dict, int]] = []
        self.cancelled_after = cancelled_after

    def send(self, response=None, flags=0):
        if response is not None and response.has_error():
            self.sent.append(({"error": response.error().message()}, flags))
            return
        tensors = {} if response is None else {t.name(): t.as_numpy() for t in response.output_tensors()}
        self.sent.append((tensors, flags))

    def is_cancelled(self) -> bool:
        return 0 <= self.cancelled_after <= len(self.sent)


class Request:
    def __init__(self, inputs: dict[str, np.ndarray], sender: Sender):
        self.inputs, self.sender = inputs, sender

    def get_response_sender(self):
        return self.sender

    def request_id(self) -> str:
        return "test-request"


@pytest.fixture
def triton_api(monkeypatch):
    """The stand-in of triton_python_backend_utils, installed for the adapter's import; `engine` answers BLS calls."""
    api = types.ModuleType("triton_python_backend_utils")
    api.engine = None
    api.Tensor, api.TritonError, api.InferenceResponse = Tensor, TritonError, InferenceResponse
    api.TRITONSERVER_RESPONSE_COMPLETE_FINAL, api.TRITONSERVER_MEMORY_CPU = FINAL, 0
    api.PreferredMemory = lambda kind, device: (kind, device)
    api.Logger = types.SimpleNamespace(log_info=lambda message: None, log_warn=lambda message: None)
    api.get_input_tensor_by_name = lambda request, name: (
        Tensor(name, request.inputs[name]) if name in request.inputs else None
    )

    class InferenceRequest:
        def __init__(self, model_name, requested_output_names, inputs, request_id="", preferred_memory=None):
            self.model_name, self.inputs, self.request_id = model_name, inputs, request_id
            self.requested_output_names = requested_output_names

        def exec(self, decoupled=False):
            return api.engine.stream(self)

    api.InferenceRequest = InferenceRequest
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", api)
    for module in [name for name in sys.modules if name.startswith("thinkserve_backend.models")]:
        monkeypatch.delitem(sys.modules, module)
    return api


@pytest.fixture
def serve_language_model(triton_api, tmp_path):
    """TrtllmLanguageModel initialised as Triton would, with the recordings' tokenizer and parameters (plus any
    given)."""
    from thinkserve_backend.models.trtllm_adapter import TrtllmLanguageModel

    tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(VOCAB)}, unk_token="!"))
    tokenizer.add_special_tokens(["<|endoftext|>", "<|im_end|>", "<image>"])
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.Fuse()
    (tmp_path / "1").mkdir()
    tokenizer.save(str(tmp_path / "1" / "tokenizer.json"))
    served = []

    def serve(**extra: str):
        parameters = {
            "tokenizer_file": "tokenizer.json", "eos_token_ids": json.dumps(EOS), "max_context": "64",
            "vocab_size": str(VOCAB_SIZE), "engine_model": "llm_engine", "max_concurrent_generations": "1", **extra,
        }
        config = {"parameters": {key: {"string_value": value} for key, value in parameters.items()}, "input": [], "output": []}
        model = TrtllmLanguageModel()
        model.initialize({"model_config": json.dumps(config), "model_name": "llm", "model_repository": str(tmp_path),
                          "model_version": "1"})
        served.append(model)
        return model

    yield serve
    for model in served:
        model.finalize()


@pytest.fixture
def language_model(serve_language_model):
    """As the gpu target deploys it: no logits streamed."""
    return serve_language_model()


def replay(name: str, fail: str = "") -> Engine:
    return Engine([{k: array(v) for k, v in r.items()} for r in load(name)["responses"]], fail)


def prompt(text: str = "Hello", **inputs) -> dict[str, np.ndarray]:
    return {"text_input": np.array([[text.encode()]], dtype=np.object_), **inputs}


def text_of(sent) -> str:
    return "".join(tensors["text_output"].reshape(-1)[0].decode() for tensors, _ in sent if "text_output" in tensors)


def test_a_greedy_stream_reaches_the_client_as_the_recording_says(triton_api, serve_language_model):
    language_model = serve_language_model(generation_logits="true")  # as the recording was asked
    triton_api.engine = replay("greedy_end_id")
    sender = Sender()
    language_model._serve(Request(prompt(max_tokens=np.array([[8]], dtype=np.int32)), sender))
    expected = load("greedy_end_id")["expected_steps"]
    assert text_of(sender.sent) == "".join(step["text"] for step in expected)
    assert [flags for _, flags in sender.sent] == [0] * (len(expected) - 1) + [FINAL]
    last = sender.sent[-1][0]
    assert last["finish_reason"].reshape(-1)[0] == b"eos" and int(last["completion_tokens"][0, 0]) == 3
    (sent,) = triton_api.engine.requests
    assert sent["request_output_len"].tolist() == [[8]] and sent["streaming"].tolist() == [[True]]
    assert sent["input_ids"].dtype == np.int32 and sent["return_generation_logits"].tolist() == [[True]]


def test_by_default_a_stream_asks_the_engine_for_log_probabilities_not_the_vocabularys_logits(triton_api, language_model):
    triton_api.engine = replay("stop_string")  # a recording made without logits
    language_model._serve(Request(prompt(max_tokens=np.array([[4]], dtype=np.int32), temperature=np.array([[1.0]], dtype=np.float32)), Sender()))
    (sent,) = triton_api.engine.requests
    assert sent["return_generation_logits"].tolist() == [[False]] and sent["return_log_probs"].tolist() == [[True]]
    assert "generation_logits" not in triton_api.engine.outputs[0]


def test_a_probe_that_wants_entropies_gets_the_engines_logits(triton_api, language_model):
    triton_api.engine = replay("greedy_end_id")  # a recording made with logits
    sender = Sender()
    language_model._serve(Request(prompt(max_tokens=np.array([[8]], dtype=np.int32), entropies=np.array([[True]])), sender))
    (sent,) = triton_api.engine.requests
    assert sent["return_generation_logits"].tolist() == [[True]] and "generation_logits" in triton_api.engine.outputs[0]
    entropies = np.concatenate([tensors["normalized_entropy"].reshape(-1) for tensors, _ in sender.sent if "normalized_entropy" in tensors])
    assert len(entropies) and np.isfinite(entropies).all()


def test_a_stop_string_ends_the_stream_and_cancels_the_engine(triton_api, language_model):
    recording = load("stop_string")
    triton_api.engine = replay("stop_string")
    sender = Sender()
    stop = np.array([[s.encode() for s in recording["request"]["stop"]]], dtype=np.object_)
    language_model._serve(Request(prompt(max_tokens=np.array([[recording["request"]["max_tokens"]]], dtype=np.int32), stop=stop), sender))
    assert sender.sent[-1][0]["finish_reason"].reshape(-1)[0] == b"stop"
    assert text_of(sender.sent) == "".join(step["text"] for step in recording["expected_steps"])
    assert triton_api.engine.cancelled == 1


def test_a_client_that_leaves_cancels_the_engine_request(triton_api, language_model):
    triton_api.engine = replay("greedy_end_id")
    sender = Sender(cancelled_after=1)
    language_model._serve(Request(prompt(), sender))
    assert sender.sent[-1] == ({}, FINAL)  # the cancelled stream's last, empty response
    assert triton_api.engine.cancelled == 1


def test_an_engine_error_is_sent_naming_both_models(triton_api, language_model):
    triton_api.engine = replay("greedy_end_id", fail="out of KV cache blocks")
    sender = Sender()
    language_model._serve(Request(prompt(), sender))
    ((error, flags),) = sender.sent
    assert flags == FINAL and error["error"] == "llm: llm_engine: out of KV cache blocks"


def test_a_prompt_beyond_the_context_never_reaches_the_engine(triton_api, language_model):
    triton_api.engine = replay("greedy_end_id")
    sender = Sender()
    language_model._serve(Request(prompt(" ".join(["Hello"] * 80)), sender))
    ((error, _),) = sender.sent
    assert "the model's context is 64 tokens" in error["error"] and not triton_api.engine.requests


def test_the_recordings_are_those_the_adapter_tests_read():
    assert (RECORDED / "greedy_end_id.json").is_file() and (RECORDED / "stop_string.json").is_file()
