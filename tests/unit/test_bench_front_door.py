"""`thinkserve-bench NAME`: every benchmark, mode or script, behind one command (thinkserve_bench.catalogue)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from thinkserve_bench import catalogue, command, result_files

SCRIPTS = catalogue.script_names()


def test_the_catalogue_holds_every_benchmark_script_and_no_library_module():
    assert {"document_qa", "ingest", "ocr_quality", "fuzz", "triton_recovery", "answerability"} <= set(SCRIPTS)
    # Modules the scripts share, and own_time's client process, are not benchmarks of their own.
    assert not {"qa_dataset", "page_baselines", "answer_comparison", "synthetic_collection", "grpc_query_timing"} & set(SCRIPTS)
    assert len(SCRIPTS) == 19


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_answers_help_under_the_front_door(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        command.main([name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: thinkserve-bench {name} ")


def test_the_command_lists_every_benchmark_and_takes_either_spelling(capsys):
    with pytest.raises(SystemExit):
        command.main(["--help"])
    listed = capsys.readouterr().out
    for name in [*command.MODES, *SCRIPTS]:
        assert f"\n  {name} " in listed
    with pytest.raises(SystemExit):
        command.main(["content-list-ingest", "--help"])
    assert capsys.readouterr().out.startswith("usage: thinkserve-bench content_list_ingest ")


def test_a_script_named_after_the_global_options_is_refused_with_the_cause():
    done = subprocess.run([sys.executable, "-m", "thinkserve_bench", "--profile", "tiny", "ingest"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "ingest is a benchmark script: its name comes first" in done.stderr


def test_a_result_records_the_command_as_it_was_typed(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/thinkserve-bench", "ingest", "--documents", "3"])
    assert result_files.invocation("ingest", ["--documents", "3"]) == "thinkserve-bench ingest --documents 3"
    monkeypatch.setattr(sys, "argv", ["/repo/bench/thinkserve_bench/scripts/ingest.py", "--documents", "3"])
    assert result_files.invocation("ingest", ["--documents", "3"]).endswith(" -m thinkserve_bench.scripts.ingest --documents 3")
    monkeypatch.setattr(sys, "argv", ["/repo/bench/thinkserve_bench/__main__.py", "ingest"])
    assert result_files.invocation("ingest", []).endswith(" -m thinkserve_bench ingest")
