import pytest

from orchestrator.config import Settings
from orchestrator.errors import InvalidOptionError, InvalidRequestError
from orchestrator.pipeline.plan import QueryOptions, make_plan, router_mode


def test_the_route_policy_decides_unless_the_request_or_server_say_otherwise():
    settings = Settings()
    simple, complex_ = make_plan("simple", QueryOptions(), settings), make_plan("complex", QueryOptions(), settings)
    assert (simple.evidence_k, simple.chunk_top_k, simple.graph_hops, simple.page_images) == (3, 10, 1, False)
    assert (complex_.evidence_k, complex_.chunk_top_k, complex_.graph_hops) == (8, 20, 2)
    assert make_plan("complex", QueryOptions(), Settings(profile="hf")).page_images
    # the tiny profile answers extractively, so the uncertainty loop (which needs the LLM's entropies) is off
    assert complex_.answerer == "extractive" and not complex_.uncertainty
    assert make_plan("complex", QueryOptions(answerer="llm"), settings).uncertainty

    # a request can switch a stage off, never on against its route or the server
    assert not make_plan("complex", QueryOptions(graph=False, rerank=False), settings).graph
    assert not make_plan("simple", QueryOptions(page_images=True), settings).page_images
    # the Simple route does not expand the graph (a single-fact lookup gains nothing from it), the others do
    assert not simple.graph and not make_plan("simple", QueryOptions(graph=True), settings).graph
    assert make_plan("moderate", QueryOptions(), settings).graph and complex_.graph
    graph_everywhere = Settings.load(None, {"routes.simple": {**settings.routes.simple.model_dump(), "graph": True}})
    assert make_plan("simple", QueryOptions(), graph_everywhere).graph
    no_pages = Settings.load(None, {"pages.enabled": False})
    assert not make_plan("complex", QueryOptions(page_images=True), no_pages).page_images

    chosen = make_plan("moderate", QueryOptions(top_k=2, chunk_top_k=7, entity_top_k=0, graph_hops=3, page_top_m=9), settings)
    assert (chosen.evidence_k, chosen.chunk_top_k, chosen.entity_top_k, chosen.graph_hops, chosen.page_top_m) == (2, 7, 0, 3, 9)


def test_stages_whose_models_are_random_in_the_profile_run_only_when_a_request_asks():
    """The tiny profile's page encoders and VLM have random weights: page-image retrieval (with the VLM's filter) and
    perception do not run by default, a request may still ask for them, and the server switch still wins."""
    tiny, trained = Settings(), Settings(profile="hf")
    assert (tiny.pages.run_by_default, tiny.perception.mode) == (False, "off")
    assert (trained.pages.run_by_default, trained.perception.mode) == (True, "dpr")
    for route in ("simple", "moderate", "complex"):
        plan = make_plan(route, QueryOptions(), tiny)
        assert not plan.page_images and plan.perception == "off"
    asked = make_plan("complex", QueryOptions(page_images=True, perception="dpr"), tiny)
    assert asked.page_images and asked.perception == "dpr"
    assert not make_plan("simple", QueryOptions(page_images=True), tiny).page_images  # the route still decides
    assert not make_plan("complex", QueryOptions(page_images=True), Settings.load(None, {"pages.enabled": False})).page_images
    assert make_plan("complex", QueryOptions(), trained).page_images and make_plan("complex", QueryOptions(), trained).perception == "dpr"
    assert not make_plan("complex", QueryOptions(page_images=False), trained).page_images
    # an operator may run them in the tiny profile all the same (a benchmark of their cost says so)
    costed = Settings.load(None, {"pages.run_by_default": True, "perception.mode": "dpr"})
    assert make_plan("complex", QueryOptions(), costed).page_images and make_plan("complex", QueryOptions(), costed).perception == "dpr"


def test_a_cross_encoder_without_weight_runs_only_when_the_request_asks_for_it():
    tiny = Settings()  # rerank_weight 0: its cross-encoder has random weights
    assert make_plan("complex", QueryOptions(), tiny).rerank_weight == 0.0
    assert not make_plan("complex", QueryOptions(), tiny).rerank
    assert make_plan("complex", QueryOptions(rerank=True), tiny).rerank  # a benchmark of its cost asks for it
    assert not make_plan("complex", QueryOptions(rerank=True), Settings.load(None, {"retrieval.rerank": False})).rerank
    trained = Settings(profile="hf")
    assert make_plan("simple", QueryOptions(), trained).rerank and make_plan("simple", QueryOptions(), trained).rerank_weight == 1.0
    assert not make_plan("simple", QueryOptions(rerank=False), trained).rerank
    weighted = Settings.load(None, {"retrieval.rerank_weight": 0.3})
    assert make_plan("moderate", QueryOptions(), weighted).rerank


def test_perception_is_off_where_the_route_says_so_but_end_to_end_stays_a_choice():
    settings = Settings.load(None, {"routes.simple": {**Settings().routes.simple.model_dump(), "perception": False},
                                    "perception.mode": "dpr"})
    assert make_plan("simple", QueryOptions(), settings).perception == "off"
    assert make_plan("simple", QueryOptions(perception="end_to_end"), settings).perception == "end_to_end"
    assert make_plan("complex", QueryOptions(), settings).perception == "dpr"


def test_each_route_describes_its_own_number_of_visual_items():
    settings = Settings()
    assert [make_plan(route, QueryOptions(), settings).perception_items for route in ("simple", "moderate", "complex")] == [2, 4, 6]
    deeper = Settings.load(None, {"routes.simple": {**settings.routes.simple.model_dump(), "perception_items": 5}})
    assert make_plan("simple", QueryOptions(), deeper).perception_items == 5


def test_router_mode():
    settings = Settings()
    assert router_mode(QueryOptions(), settings) == "features"
    assert router_mode(QueryOptions(router="model"), settings) == "model"
    assert router_mode(QueryOptions(route="simple", router="model"), settings) == "fixed"
    assert router_mode(QueryOptions(), Settings(profile="hf")) == "model"


@pytest.mark.parametrize(
    "options, message",
    [
        (QueryOptions(top_k=0), "top_k must be in 1..50 (retrieval.max_top_k)"),
        (QueryOptions(chunk_top_k=51), "chunk_top_k must be in 1..50"),
        (QueryOptions(graph_hops=5), "graph_hops must be in 0..4"),
        (QueryOptions(page_top_m=201), "page_top_m must be in 1..200 (pages.max_top_m)"),
        (QueryOptions(route="hard"), "route must be one of simple, moderate, complex"),
        (QueryOptions(perception="both"), "perception must be one of dpr, end_to_end, off"),
        (QueryOptions(answerer="oracle"), "answerer must be one of extractive, llm"),
        (QueryOptions(max_tokens=5000), "generation.max_tokens_limit"),
        (QueryOptions(top_p=0.0), "top_p must be in (0, 1]"),
    ],
)
def test_bad_options_name_the_option_and_its_limit(options, message):
    with pytest.raises(InvalidRequestError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        options.check(Settings())


@pytest.mark.parametrize(
    "values, option, message",
    [
        ({"top_k": "5"}, "top_k", "option top_k must be an integer, got '5'"),
        ({"top_k": 5.0}, "top_k", "option top_k must be an integer, got 5.0"),
        ({"graph_hops": True}, "graph_hops", "option graph_hops must be an integer, got True"),
        ({"temperature": "warm"}, "temperature", "option temperature must be a number, got 'warm'"),
        ({"top_p": False}, "top_p", "option top_p must be a number, got False"),
        ({"rerank": 1}, "rerank", "option rerank must be true or false, got 1"),
        ({"route": 3}, "route", "option route must be a string, got 3"),
        ({"rerankk": True}, "rerankk", "unknown option rerankk; known: top_k, chunk_top_k"),
    ],
)
def test_request_values_of_the_wrong_type_or_name_are_refused_naming_the_option(values, option, message):
    with pytest.raises(InvalidOptionError) as refused:
        QueryOptions.parse(values)
    assert refused.value.param == option and str(refused.value).startswith(message)
    assert isinstance(refused.value, InvalidRequestError)  # INVALID_ARGUMENT over gRPC, 400 over HTTP


def test_parsed_values_keep_their_types_and_unset_options_stay_none():
    options = QueryOptions.parse({"top_k": 3, "temperature": 1, "rerank": False, "route": "simple", "seed": None})
    assert options == QueryOptions(top_k=3, temperature=1.0, rerank=False, route="simple")
    assert isinstance(options.temperature, float) and options.answerer is None
    options.check(Settings())
    with pytest.raises(InvalidOptionError, match="route must be one of") as refused:
        QueryOptions.parse({"route": "hard"}).check(Settings())
    assert refused.value.param == "route"


def test_every_query_option_is_in_the_proto_and_an_ask_flag_with_its_description():
    """One list of options: the proto's QueryOptions, the validated model and the CLI's `ask` flags agree."""
    from orchestrator.api.protos import pb
    from orchestrator.cli import build_parser

    assert set(QueryOptions.model_fields) == {field.name for field in pb.QueryOptions.DESCRIPTOR.fields}
    parser = build_parser()
    ask = parser._subparsers._group_actions[0].choices["ask"]
    flags = {action.dest: action for action in ask._actions}
    for name, field in QueryOptions.model_fields.items():
        assert name in flags and field.description and flags[name].help == field.description, name
    args = parser.parse_args(["ask", "--collection", "c", "q", "--top-p", "0.5", "--no-page-lexical", "--route", "simple"])
    assert (args.top_p, args.page_lexical, args.route, args.temperature) == (0.5, False, "simple", None)
