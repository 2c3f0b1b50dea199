"""Running generated cases against a live deployment and judging each answer.

A case passes when the server answers it with a result or a client error that names its cause: gRPC
INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION / ALREADY_EXISTS / RESOURCE_EXHAUSTED with details, or HTTP
4xx with an error message. A defect is anything else: INTERNAL, UNKNOWN, UNAVAILABLE, an HTTP 5xx, a client
error without a message, no answer within the hang limit (a hang), or the server not healthy after a batch
(a crash: the Health RPC fails or a model is no longer ready).

Hypothesis draws the cases (seeded, so a run replays); nothing raises inside the drawn function, so every case
is counted and none is shrunk away.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import grpc
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from orchestrator.api.protos import pb

from .hostile_files import HostileFile, hostile_files
from .proto_messages import ingest_streams, requests

SERVICE = pb.DESCRIPTOR.services_by_name["ThinkServe"]
CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
}
HANG_S = 120.0  # no answer within this: a hang (the slowest legitimate case, a PDF parse, takes seconds)
HEALTH_EVERY = 50  # cases between health checks


@dataclass
class Outcome:
    surface: str  # grpc | rest | files
    family: str  # the RPC, the HTTP operation, or the file family
    answer: str  # OK, a gRPC code name, or "HTTP 400"
    seconds: float
    defect: str = ""  # why this answer is a defect; empty: it is not
    case: str = ""  # what was sent (shortened), to replay a defect by hand
    detail: str = ""  # the server's message (shortened)


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    health_checks: int = 0
    health_failures: list[str] = field(default_factory=list)
    conformance: Counter = field(default_factory=Counter)  # Schemathesis' other checks: the description vs the server
    conformance_examples: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)

    def defects(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.defect]

    def summary(self) -> dict[str, Any]:
        by_surface: dict[str, dict] = {}
        for o in self.outcomes:
            entry = by_surface.setdefault(o.surface, {"cases": 0, "answers": Counter(), "families": Counter(), "defects": 0,
                                                      "hangs": 0, "slowest_s": 0.0})
            entry["cases"] += 1
            entry["answers"][o.answer] += 1
            entry["families"][o.family] += 1
            entry["defects"] += bool(o.defect)
            entry["hangs"] += o.defect.startswith("hang")
            entry["slowest_s"] = max(entry["slowest_s"], o.seconds)
        for entry in by_surface.values():
            entry["answers"], entry["families"] = dict(entry["answers"]), dict(entry["families"])
        defects = self.defects()
        return {
            "cases": len(self.outcomes), "by_surface": by_surface,
            "defects": len(defects), "server_errors": sum(d.defect.startswith("server error") for d in defects),
            "hangs": sum(d.defect.startswith("hang") for d in defects),
            "health_checks": self.health_checks, "crashes": len(self.health_failures),
            "health_failures": self.health_failures[:20],
            "defect_examples": [asdict(d) for d in defects[:50]],
            "conformance": dict(self.conformance), "conformance_examples": self.conformance_examples[:20],
        }


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def judge_grpc(error: Optional[grpc.RpcError], seconds: float) -> tuple[str, str, str]:
    """(answer, defect, detail) of a gRPC call's end."""
    if error is None:
        return "OK", "", ""
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return code.name, f"hang: no answer within {seconds:.0f} s", details[:300]
    if code not in CLIENT_ERRORS:
        return code.name, f"server error: {code.name}", details[:300]
    if not details.strip():
        return code.name, f"{code.name} without a message naming the cause", ""
    return code.name, "", details[:300]


def judge_http(status: Optional[int], body: bytes, seconds: float) -> tuple[str, str, str]:
    if status is None:
        return "no answer", f"hang: no answer within {seconds:.0f} s", ""
    answer = f"HTTP {status}"
    text = body[:300].decode(errors="replace")
    if status >= 500:
        return answer, f"server error: HTTP {status}", text
    if status >= 400 and b'"message"' not in body[:4096] and not text.strip():
        return answer, f"HTTP {status} without a message naming the cause", text
    return answer, "", text


def _hypothesis(examples: int, run_seed: int):
    """Settings for `examples` drawn cases: no deadline (servers take their time), no shrinking, no database."""
    def decorate(function):
        configured = settings(max_examples=examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                              suppress_health_check=list(HealthCheck))(function)
        return seed(run_seed)(configured)

    return decorate


# ---------------------------------------------------------------------- gRPC


def _serialize(request) -> bytes:
    """A message's wire bytes; raw bytes (the cases that are no message) go as they are."""
    return request if isinstance(request, bytes) else request.SerializeToString()


class GrpcFuzzer:
    """Generated messages for every RPC of the service (from its descriptor), and raw bytes that are no message."""

    def __init__(self, address: str, tally: Tally, health: Callable[[], Optional[str]], timeout_s: float = HANG_S):
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
        self.tally, self.health, self.timeout_s = tally, health, timeout_s
        self.count = 0

    def close(self) -> None:
        self.channel.close()

    def _call(self, method, request) -> Optional[grpc.RpcError]:
        path = f"/{SERVICE.full_name}/{method.name}"
        output = GetMessageClass(method.output_type)
        try:
            if method.client_streaming:
                call = self.channel.stream_unary(path, request_serializer=_serialize, response_deserializer=output.FromString)
                call(iter(request), timeout=self.timeout_s)
            elif method.server_streaming:
                call = self.channel.unary_stream(path, request_serializer=_serialize, response_deserializer=output.FromString)
                for _ in call(request, timeout=self.timeout_s):
                    pass
            else:
                call = self.channel.unary_unary(path, request_serializer=_serialize, response_deserializer=output.FromString)
                call(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            return error
        return None

    def _record(self, family: str, request, started: float, error: Optional[grpc.RpcError]) -> None:
        seconds = time.monotonic() - started
        answer, defect, detail = judge_grpc(error, seconds)
        self.tally.add(Outcome("grpc", family, answer, seconds, defect, _short(request), detail))
        self.count += 1
        if self.count % HEALTH_EVERY == 0:
            self._check_health()

    def _check_health(self) -> None:
        self.tally.health_checks += 1
        problem = self.health()
        if problem:
            self.tally.health_failures.append(f"after gRPC case {self.count}: {problem}")

    def run(self, examples_per_method: int, run_seed: int, raw_examples: int, skip: tuple[str, ...] = ()) -> None:
        for method in SERVICE.methods:
            if method.name not in skip:
                self._method(method, examples_per_method, run_seed)
        unary = [m for m in SERVICE.methods if not m.client_streaming and m.name not in skip]

        @_hypothesis(raw_examples, run_seed)
        @given(method=st.sampled_from(unary), raw=st.one_of(st.binary(max_size=2048),
                                                            st.sampled_from([b"\xff" * 8, b"\x0a\xff\xff\xff\xff\x0f", b"\x12"])))
        def raw_bytes(method, raw):  # bytes that are no message of the method's type
            started = time.monotonic()
            self._record(f"raw bytes to {method.name}", raw, started, self._call(method, raw))

        raw_bytes()

    def _method(self, method, examples: int, run_seed: int) -> None:
        if method.client_streaming:
            strategy = ingest_streams(pb.DocumentHeader.DESCRIPTOR, method.input_type)
        else:
            strategy = requests(method.input_type)

        @_hypothesis(examples, run_seed)
        @given(request=strategy)
        def one(request):
            started = time.monotonic()
            self._record(method.name, request, started, self._call(method, request))

        one()


# ---------------------------------------------------------------------- files


class FileFuzzer:
    """Hostile documents uploaded through Ingest (gRPC) and PUT .../documents/{name} (HTTP), alternately."""

    def __init__(self, address: str, http: str, tally: Tally, health: Callable[[], Optional[str]], max_upload_bytes: int,
                 collection: str = "fuzz-files", timeout_s: float = HANG_S):
        from orchestrator.client import ThinkServeClient

        self.client = ThinkServeClient(address, timeout_s=timeout_s)
        self.http, self.tally, self.health = http, tally, health
        self.max_upload_bytes, self.collection, self.timeout_s = max_upload_bytes, collection, timeout_s
        self.count = 0

    def close(self) -> None:
        self.client.close()

    def send(self, case: HostileFile) -> Outcome:
        import httpx

        started = time.monotonic()
        if self.count % 2 == 0:
            error: Optional[grpc.RpcError] = None
            try:
                self.client.ingest(self.collection, case.data, case.filename, case.media_type)
            except grpc.RpcError as raised:
                error = raised
            answer, defect, detail = judge_grpc(error, time.monotonic() - started)
            surface = "Ingest"
        else:
            from urllib.parse import quote

            headers = {"content-type": case.media_type or "application/octet-stream", "x-request-timeout": str(self.timeout_s)}
            try:
                response = httpx.put(f"{self.http}/api/v1/collections/{self.collection}/documents/{quote(case.filename, safe='')}",
                                     content=case.data, headers=headers, timeout=self.timeout_s + 10)
                status, body = response.status_code, response.content
            except (httpx.TimeoutException, httpx.TransportError):
                status, body = None, b""
            answer, defect, detail = judge_http(status, body, time.monotonic() - started)
            surface = "PUT"
        return Outcome("files", case.kind, answer, time.monotonic() - started, defect, f"{surface} {case.describe()}", detail)

    def run(self, examples: int, run_seed: int, on_case: Optional[Callable[[Outcome], None]] = None) -> None:
        @_hypothesis(examples, run_seed)
        @given(case=hostile_files(self.max_upload_bytes))
        def one(case):
            outcome = self.send(case)
            self.tally.add(outcome)
            if on_case is not None:
                on_case(outcome)
            self.count += 1
            if self.count % HEALTH_EVERY == 0:
                self.tally.health_checks += 1
                problem = self.health()
                if problem:
                    self.tally.health_failures.append(f"after file case {self.count}: {problem}")

        one()


# ---------------------------------------------------------------------- HTTP (Schemathesis)


class RestFuzzer:
    """Every operation of the service's OpenAPI description, positive (valid by the schema) and negative (invalid
    by it) cases drawn by Schemathesis, sent to the live server."""

    def __init__(self, http: str, tally: Tally, health: Callable[[], Optional[str]], timeout_s: float = HANG_S):
        import schemathesis

        self.schema = schemathesis.openapi.from_url(f"{http}/api/v1/openapi.json")
        self.http, self.tally, self.health, self.timeout_s = http, tally, health, timeout_s
        self.count = 0

    def operations(self) -> list:
        return [result.ok() for result in self.schema.get_all_operations()]

    def run(self, examples_per_operation: int, run_seed: int, skip: tuple[str, ...] = ()) -> None:
        from schemathesis import GenerationMode
        from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance

        conformance = [status_code_conformance, content_type_conformance, response_schema_conformance]
        for operation in self.operations():
            label = f"{operation.method.upper()} {operation.path}"
            if label in skip:
                continue
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    self._operation(operation, label, mode, examples_per_operation, run_seed, conformance)
                except Unsatisfiable:  # no negative case exists (an operation without parameters or body)
                    self.tally.conformance[f"no {mode.value} cases: {label}"] += 1

    def _operation(self, operation, label: str, mode, examples: int, run_seed: int, conformance: list) -> None:
        import requests

        @_hypothesis(examples, run_seed)
        @given(case=operation.as_strategy(generation_mode=mode))
        def one(case):
            case.headers = {**(case.headers or {}), "x-request-timeout": str(self.timeout_s)}
            started = time.monotonic()
            try:
                response = case.call(base_url=self.http, timeout=self.timeout_s + 10)
                status, body = response.status_code, response.content
            except (requests.Timeout, requests.ConnectionError):
                response, status, body = None, None, b""
            seconds = time.monotonic() - started
            answer, defect, detail = judge_http(status, body or b"", seconds)
            self.tally.add(Outcome("rest", f"{label} ({mode.value})", answer, seconds, defect, _case_text(case), detail))
            if response is not None and status is not None and status < 500:
                for check in conformance:
                    try:
                        case.validate_response(response, checks=[check])
                    except (Exception, BaseExceptionGroup) as failure:  # noqa: BLE001 - Schemathesis raises its check failures
                        key = f"{check.__name__}: {label}"
                        self.tally.conformance[key] += 1
                        if self.tally.conformance[key] == 1:
                            self.tally.conformance_examples.append(f"{key} ({answer}): {str(failure)[:300]}")
            self.count += 1
            if self.count % HEALTH_EVERY == 0:
                self.tally.health_checks += 1
                problem = self.health()
                if problem:
                    self.tally.health_failures.append(f"after HTTP case {self.count}: {problem}")

        one()


def _case_text(case) -> str:
    """The request as a curl command where Schemathesis can write one, else its repr (shortened)."""
    try:
        return _short(case.as_curl_command(), 500)
    except Exception:  # noqa: BLE001 - a description only
        return _short(case)


def health_probe(address: str, collection: str, question: str) -> Callable[[], Optional[str]]:
    """A check that the server still serves: Health says every model is ready, and a question is answered."""
    from orchestrator.client import ThinkServeClient

    def check() -> Optional[str]:
        try:
            with ThinkServeClient(address, timeout_s=60) as client:
                health = client.health()
                down = [m.name for m in health.models if not m.ready]
                if down:
                    return f"models not ready: {down}"
                finals = [e for e in client.query(collection, question) if e.WhichOneof("event") == "final"]
                return None if finals else "a question got no final answer"
        except grpc.RpcError as error:
            return f"{error.code().name}: {error.details()}"

    return check
