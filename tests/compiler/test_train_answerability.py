"""`thinkserve-build train-answerability`: the shipped answerability file is trained by the model compiler, from the
examples the answerability benchmark collected and committed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.models.answerability import MODEL_FILE, load_models
from tests.conftest import ROOT
from thinkserve_build import cli

EXAMPLES = ROOT / "benchmarks" / "results" / "mmlongbench-dev" / "answerability.json.gz"


def test_the_shipped_file_is_what_the_compiler_trains_from_the_committed_examples(tmp_path):
    output = tmp_path / "answerability.json"
    assert cli.main(["train-answerability", "--examples", str(EXAMPLES), "--output", str(output)]) == 0
    trained, shipped = load_models(output), load_models(MODEL_FILE)
    assert json.loads(output.read_text())["command"].startswith("thinkserve-build train-answerability --examples ")
    for mode in ("full", "lexical"):
        ours, theirs = trained.model(mode), shipped.model(mode)
        assert ours.features == theirs.features and ours.threshold == theirs.threshold
        for name in ("mean", "scale", "coefficients"):
            np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=0, atol=1e-9)
        assert ours.intercept == pytest.approx(theirs.intercept, abs=1e-9)


def test_a_file_without_examples_is_refused_with_the_cause(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"examples": []}))
    assert cli.main(["train-answerability", "--examples", str(results), "--output", str(tmp_path / "out.json")]) == 1
    assert "no examples with both modes' features" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
