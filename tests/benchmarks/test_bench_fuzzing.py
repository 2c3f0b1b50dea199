"""The fuzzer's message generators (thinkserve_bench.fuzzing.proto_messages): plausible requests get past the
server's validation, so the generated half of every run that is plausible exercises the work behind it."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.api.convert import query_input
from orchestrator.api.protos import pb
from orchestrator.config import Settings
from orchestrator.errors import InvalidRequestError
from tests.conftest import MODEL_REPOSITORY
from thinkserve_bench.fuzzing.proto_messages import messages, requests

CONFIG = Settings.load(overrides={"triton": {"model_repository": str(MODEL_REPOSITORY)}})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=messages(pb.QueryRequest.DESCRIPTOR, plausible=True))
def test_a_plausible_query_passes_the_servers_option_checks(request):
    query_input(request).options.check(CONFIG)  # raises InvalidOptionError (an InvalidRequestError) otherwise


def test_requests_mix_plausible_and_hostile_queries():
    outcomes = []

    @settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(request=requests(pb.QueryRequest.DESCRIPTOR), data=st.data())
    def run(request, data):
        try:
            query_input(request).options.check(CONFIG)
            outcomes.append(True)
        except InvalidRequestError:
            outcomes.append(False)

    run()
    assert 0.2 < sum(outcomes) / len(outcomes) < 0.95, f"{sum(outcomes)} of {len(outcomes)} accepted"
