"""Regression tests for what the fuzzing benchmark (thinkserve_bench.scripts.fuzz) found, one each: every case
was a server error (UNKNOWN / INTERNAL / HTTP 500) for input that is the client's mistake."""

import pytest

from orchestrator.api import decoding
from orchestrator.api.protos import pb
from orchestrator.errors import InvalidRequestError
from orchestrator.knowledge.parsing.mineru import _check_input
from thinkserve_bench.fuzzing.hostile_files import png


def test_bytes_that_are_no_request_message_are_invalid_argument_not_unknown():
    """Raw bytes sent to any unary method: grpc's deserializer raised DecodeError, answered as UNKNOWN."""
    decode = decoding._tolerant(pb.QueryRequest.FromString, "QueryRequest")
    bad = decode(b"\x0a\xff\xff\xff\xff\x0f")  # field 1 (collection), a length past the end
    assert isinstance(bad, decoding.Undecodable)
    with pytest.raises(InvalidRequestError, match="the request is not a valid QueryRequest message"):
        decoding.checked(bad)
    good = decode(pb.QueryRequest(collection="c", question="q").SerializeToString())
    assert decoding.checked(good).collection == "c"


def test_every_method_of_the_service_gets_the_tolerant_deserializer():
    class Server:
        def add_generic_rpc_handlers(self, handlers):
            self.generic = handlers

        def add_registered_method_handlers(self, service, handlers):
            self.handlers = handlers

    server = Server()
    decoding.add_service(object.__new__(type("S", (), {name: None for name in pb.DESCRIPTOR.services_by_name["ThinkServe"]
                                                        .methods_by_name})), server)
    assert set(server.handlers) == set(pb.DESCRIPTOR.services_by_name["ThinkServe"].methods_by_name)
    for name, handler in server.handlers.items():
        assert isinstance(handler.request_deserializer(b"\xff\xff\xff"), decoding.Undecodable), name


def test_a_png_declaring_gigapixels_is_refused_as_a_client_error(tmp_path):
    """A 200-byte PNG declaring 50,000 x 50,000 pixels: Pillow's DecompressionBombError went up as an internal error."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png(50_000, 50_000, b"x\x9c\x03\x00\x00\x00\x00\x01"))
    with pytest.raises(InvalidRequestError, match="bomb.png: not a readable image .*decompression bomb"):
        _check_input(bomb)
