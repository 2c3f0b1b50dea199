"""Settings from the environment (THINKSERVE_SECTION__KEY) and grants from a tokens file, layered over TOML."""

from __future__ import annotations

import hashlib

import pytest

from orchestrator.config import Settings, environment_overrides
from orchestrator.errors import ConfigurationError


def test_environment_variables_set_any_key_over_the_file_and_under_explicit_overrides(tmp_path):
    config = tmp_path / "settings.toml"
    config.write_text('[server]\nport = 6000\nmax_concurrent_queries = 3\n[storage]\ndata_dir = "/from/file"\n')
    environment = {
        "THINKSERVE_SERVER__PORT": "7000",  # over the file
        "THINKSERVE_SERVER__HOST": "127.0.0.1",
        "THINKSERVE_STORAGE__DATA_DIR": "/data/thinkserve",  # a path: text, not TOML
        "THINKSERVE_RETRIEVAL__SEMANTIC_WEIGHT": "0.75",
        "THINKSERVE_RETRIEVAL__GRAPH": "false",
        "THINKSERVE_SERVER__INGEST_ROOTS": '["/srv/a", "/srv/b"]',
        "THINKSERVE_OBSERVABILITY__LOG_FORMAT": "json",
        "THINKSERVE_TOKEN": "ts_not-a-setting",  # the client's token: no section, ignored
        "THINKSERVE_NOT_A_SECTION__X": "1",
        "OTHER_SERVER__PORT": "1",
    }
    settings = Settings.load(config, {"server.max_concurrent_queries": 5}, environment=environment)
    assert settings.server.port == 7000 and settings.server.max_concurrent_queries == 5  # the explicit override wins
    assert str(settings.storage.data_dir) == "/data/thinkserve" and settings.retrieval.semantic_weight == 0.75
    assert settings.retrieval.graph is False and [str(p) for p in settings.server.ingest_roots] == ["/srv/a", "/srv/b"]
    assert settings.observability.log_format == "json"
    assert Settings.load(config).server.port == 6000  # without an environment given, none is read
    assert environment_overrides({"THINKSERVE_ROUTES__SIMPLE__EVIDENCE_K": "4"}) == {"routes.simple.evidence_k": 4}
    with pytest.raises(ConfigurationError, match="server.port"):
        Settings.load(None, environment={"THINKSERVE_SERVER__PORT": "not-a-port"})


def test_grants_from_a_tokens_file_join_the_configured_ones(tmp_path):
    digest = lambda token: hashlib.sha256(token.encode()).hexdigest()  # noqa: E731
    secret = tmp_path / "tokens.toml"
    secret.write_text(f'[[tokens]]\nname = "tenant-b"\nsha256 = "{digest("b")}"\ncollections = ["b"]\nwrite = true\n')
    config = tmp_path / "settings.toml"
    config.write_text(f'[auth]\n[[auth.tokens]]\nname = "tenant-a"\nsha256 = "{digest("a")}"\n')
    settings = Settings.load(config, environment={"THINKSERVE_AUTH__TOKENS_FILE": str(secret)})
    assert [(g.name, g.collections, g.write) for g in settings.auth.tokens] == [("tenant-a", ("*",), False), ("tenant-b", ("b",), True)]
    with pytest.raises(ConfigurationError, match="cannot read auth.tokens_file"):
        Settings.load(None, {"auth.tokens_file": str(tmp_path / "missing.toml")})
    secret.write_text(f'[[tokens]]\nname = "dup"\nsha256 = "{digest("a")}"\n')
    with pytest.raises(ConfigurationError, match="same token"):
        Settings.load(config, {"auth.tokens_file": str(secret)})
