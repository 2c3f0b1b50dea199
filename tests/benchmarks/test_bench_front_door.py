"""`thinkserve-bench NAME`: every benchmark, mode or script, behind one command (thinkserve_bench.catalogue)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from thinkserve_bench import catalogue, command, mode_options, result_files

SCRIPTS = catalogue.script_names()


def test_the_catalogue_holds_every_benchmark_script_and_no_library_module():
    assert {"document_qa", "ingest", "ocr_quality", "fuzz", "triton_recovery", "answerability"} <= set(SCRIPTS)
    # Modules the scripts share, and own_time's client process, are not benchmarks of their own.
    assert not {"qa_dataset", "page_baselines", "answer_comparison", "synthetic_collection", "grpc_query_timing"} & set(SCRIPTS)
    assert len(SCRIPTS) == 20
    # No benchmark has a second door: the scripts run only through the front door's parser.
    for name in SCRIPTS:
        source = (catalogue.SCRIPTS_DIR / f"{name}.py").read_text()
        assert "__main__" not in source and "ArgumentParser(" not in source, name


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
    # the GPU machine's tools, which keep their own entry (`__main__`), are listed too
    gpu_tools = [path.stem for path in catalogue.GPU_DIR.glob("*.py") if "__main__" in path.read_text()]
    assert sorted(gpu_tools) == sorted(catalogue.GPU_TOOLS)
    for name in [*command.MODES, *SCRIPTS, *gpu_tools]:
        assert f"\n  {name} " in listed
    with pytest.raises(SystemExit):
        command.main(["content-list-ingest", "--help"])
    assert capsys.readouterr().out.startswith("usage: thinkserve-bench content_list_ingest ")


def test_a_benchmark_named_after_its_options_is_refused_with_the_cause():
    done = subprocess.run([sys.executable, "-m", "thinkserve_bench", "--profile", "tiny", "ingest"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "the benchmark's name comes first" in done.stderr


def test_each_mode_takes_the_options_it_declares_and_refuses_the_others(capsys):
    door = command.build_parser()
    load = door.parser.parse_args(["load", "--qps", "2", "4", "--profile", "tiny"])
    assert (load.mode, load.qps, load.profile, load.configs, load.rounds) == ("load", [2.0, 4.0], "tiny", None, 1)
    latency = door.parser.parse_args(["latency", "--configs", "routed"])
    assert (latency.configs, latency.qps, latency.no_ceiling) == (["routed"], None, False)
    with pytest.raises(SystemExit):
        door.parser.parse_args(["latency", "--qps", "2"])  # an open-loop rate means nothing to one query in flight
    assert "unrecognized arguments: --qps" in capsys.readouterr().err
    # every mode's namespace holds every option the modes' shared run code reads
    dests = {option.dest for option in mode_options.OPTIONS}
    for mode in command.MODES:
        assert dests <= set(vars(door.parser.parse_args([mode])))


def test_a_script_reports_options_that_do_not_fit_together_under_its_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        command.main(["document_qa", "--set", "no-equals-sign"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: thinkserve-bench document_qa ")
    assert "--set takes KEY=VALUE, got no-equals-sign" in error


def test_a_result_records_the_command_as_it_was_typed(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/thinkserve-bench", "ingest", "--documents", "3"])
    assert result_files.invocation("ingest", ["--documents", "3"]) == "thinkserve-bench ingest --documents 3"
    monkeypatch.setattr(sys, "argv", ["/repo/benchmarks/thinkserve_bench/__main__.py", "ingest"])
    assert result_files.invocation("ingest", []).endswith(" -m thinkserve_bench ingest")


def test_the_old_second_door_names_the_front_door_instead_of_doing_nothing():
    done = subprocess.run([sys.executable, "-m", "thinkserve_bench.scripts.ingest", "--documents", "3"],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "thinkserve-bench ingest --documents 3" in done.stderr


def test_a_script_is_handed_its_own_options_only(monkeypatch):
    from thinkserve_bench.scripts import service_overhead

    seen = {}
    monkeypatch.setattr(service_overhead, "run_benchmark", lambda args, command: seen.update(vars(args), command=command))
    assert command.main(["service-overhead", "--rounds", "3"]) == 0
    assert seen == {"rounds": 3, "tokens": 100, "command": "thinkserve-bench service_overhead --rounds 3"}
