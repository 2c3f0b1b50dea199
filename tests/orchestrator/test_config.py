import pytest

from orchestrator.config import Settings
from orchestrator.errors import ConfigurationError


def test_file_then_overrides(tmp_path):
    path = tmp_path / "thinkserve.toml"
    path.write_text('profile = "hf"\n[server]\nport = 6000\n[routes.simple]\nevidence_k = 7\nchunk_top_k = 9\n'
                    "entity_top_k = 0\ngraph_hops = 0\nrerank = false\npage_images = false\nperception = false\n"
                    "uncertainty = false\ndecompose = false\n")
    settings = Settings.load(path, {"server.port": 0, "triton.url": "127.0.0.1:8001"})
    assert (settings.profile, settings.server.port, settings.routes.simple.evidence_k) == ("hf", 0, 7)
    assert settings.triton.url == "127.0.0.1:8001"
    assert settings.routes.complex.graph_hops == 2  # untouched routes keep their defaults


def test_stages_whose_tiny_models_are_random_default_to_the_model_free_path():
    tiny, hf = Settings(), Settings(profile="hf")
    assert (tiny.router.mode, tiny.retrieval.rerank_weight, tiny.answer.answerer) == ("features", 0.0, "extractive")
    assert (hf.router.mode, hf.retrieval.rerank_weight, hf.answer.answerer) == ("model", 1.0, "llm")
    chosen = Settings.load(None, {"router.mode": "model", "answer.answerer": "llm", "retrieval.rerank_weight": 0.5})
    assert (chosen.router.mode, chosen.retrieval.rerank_weight, chosen.answer.answerer) == ("model", 0.5, "llm")


def test_unknown_keys_and_bad_values_name_the_setting(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nprot = 1\n")
    with pytest.raises(ConfigurationError, match=r"server\.prot: Extra inputs are not permitted"):
        Settings.load(path)
    with pytest.raises(ConfigurationError, match=r"triton\.exit_timeout_s"):
        Settings.load(None, {"triton.exit_timeout_s": 1})


def test_unreadable_file_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="cannot read settings file"):
        Settings.load(tmp_path / "missing.toml")


def test_the_model_repository_follows_the_profile_unless_set(tmp_path):
    assert str(Settings.load(None, {"profile": "hf"}).triton.model_repository) == "model_repository/hf"
    assert str(Settings().triton.model_repository) == "model_repository/tiny"
    explicit = Settings.load(None, {"profile": "hf", "triton.model_repository": "elsewhere"})
    assert str(explicit.triton.model_repository) == "elsewhere"


def test_the_documented_settings_example_is_valid():
    """The TOML example users copy from docs/configuration.md must load as it is."""
    import re
    import tomllib
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    example = re.search(r"```toml\n(.*?)```", page, re.S).group(1)
    settings = Settings.model_validate(tomllib.loads(example))
    assert settings.server.max_concurrent_queries == 4 and settings.http.port == 50052


def test_scratch_settings_take_free_ports_and_their_own_folder(tmp_path):
    base = Settings()
    scratch = base.scratch(tmp_path / "data")
    assert (scratch.server.port, scratch.http.port, scratch.storage.data_dir) == (0, 0, tmp_path / "data")
    assert scratch.ingest == base.ingest and base.server.port != 0  # the original is untouched


def test_the_route_names_are_the_router_models_labels_in_its_output_order():
    from orchestrator.config import ROUTE_NAMES, RouteSettings
    from orchestrator.models.contracts import ROUTE_LABELS

    assert ROUTE_NAMES == ROUTE_LABELS == ("simple", "moderate", "complex")
    assert set(RouteSettings.model_fields) == set(ROUTE_NAMES)  # a policy per route, none without a route
