"""Experiment files: valid ones parse to what they say; any mistake is one line naming the
file and the field, before anything runs."""

from __future__ import annotations

import pytest

from gpuvm.device import regs
from gpuvm.experiment.config import ConfigError, load, parse

GOOD = """
[experiment]
name = "t"
kind = "isolation"
modes = ["fv", "pv"]
policies = ["band", "fifo"]
repetitions = 2
time_scale = 2

[scheduler]
period_ms = 10

[[scenario]]
name = "s"
[[scenario.vm]]
name = "a"
benchmark = "loop"
params = [1000, 3]
count = 2
share = 2
start_s = 0.5
partition = { vram_mib = 256, channels = 4 }
"""


def test_good_file_parses():
    exp = parse(GOOD, "good.toml")
    assert exp.name == "t" and exp.kind == "isolation" and exp.repetitions == 2
    assert exp.modes == ("fv", "pv") and exp.policies == ("band", "fifo")
    assert exp.time_scale == 2.0 and exp.scheduler == {"period_ms": 10}
    vms = exp.scenarios[0].vms
    assert [v.name for v in vms] == ["a0", "a1"]
    assert vms[0].params == (1000, 3) and vms[0].share == 2.0 and vms[0].start_s == 0.5
    assert vms[0].partition == {"vram_size": 256 * regs.MiB, "channels": 4}


@pytest.mark.parametrize("change, message", [
    (("kind = \"isolation\"", "kind = \"speed\""), "experiment.kind: must be one of"),
    (("repetitions = 2", "repetitions = \"2\""), "experiment.repetitions: must be a int"),
    (("modes = [\"fv\", \"pv\"]", "modes = [\"fv\", \"fast\"]"), "unknown mode 'fast'"),
    (("policies = [\"band\", \"fifo\"]", "policies = [\"lottery\"]"), "unknown policy 'lottery'"),
    (("benchmark = \"loop\"", "benchmark = \"lud\""), "scenario[0].vm[0].benchmark: unknown"),
    (("count = 2", "count = 2\ncolour = 1"), "scenario[0].vm[0].colour: unknown key"),
    (("share = 2", "share = 0"), "scenario[0].vm[0].share: must be > 0"),
    (("params = [1000, 3]", "params = [-1]"), "scenario[0].vm[0].params: must be"),
    (("channels = 4", "channels = 4, ram = 1"), "scenario[0].vm[0].partition.ram: unknown key"),
    (("period_ms = 10", "period_ms = -10"), "good.toml: scheduler:"),
    (("[[scenario]]\nname = \"s\"", "[[scenario]]\nnom = \"s\""), "scenario[0].name: missing"),
    (("name = \"t\"", "name = \"a/b\""), "experiment.name: must be a non-empty name"),
    (("time_scale = 2", "time_scale = 2\nspeed = 1"), "experiment.speed: unknown key"),
    (("time_scale = 2", "time_scale = 2\nisolated = 1"),
     "experiment.isolated: must be a bool"),
])
def test_mistakes_are_one_line_naming_the_field(change, message):
    old, new = change
    assert old in GOOD
    with pytest.raises(ConfigError) as exc:
        parse(GOOD.replace(old, new, 1), "good.toml")
    text = str(exc.value)
    assert "\n" not in text and text.startswith("good.toml: ") and message in text, text


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^x.toml: not valid TOML"):
        parse("[experiment\nname=1", "x.toml")
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "absent.toml")


def test_shipped_experiments_parse():
    from pathlib import Path
    files = sorted(Path(__file__).resolve().parents[1].glob("experiments/*.toml"))
    assert files
    for f in files:
        exp = load(f)
        assert exp.scenarios or (exp.kind == "suite" and all(
            load(i).scenarios for i in exp.includes))


def test_paper_suite_includes_the_three_parts():
    from pathlib import Path
    paper = load(Path(__file__).resolve().parents[1] / "experiments" / "paper.toml")
    kinds = [load(p).kind for p in paper.includes]
    assert paper.kind == "suite" and kinds == ["benchmarks", "scaling", "isolation"]
    scaling = load(paper.includes[1])
    assert [len(s.vms) for s in scaling.scenarios] == [1, 2, 4, 8]
    assert set(scaling.modes) == {"fv", "fv-opt", "pv"}


@pytest.mark.parametrize("text, message", [
    ('[experiment]\nname = "s"\nkind = "suite"\n', "a suite needs at least one file"),
    ('[experiment]\nname = "s"\nkind = "suite"\ninclude = ["nope.toml"]\n',
     "include: nope.toml: no such file"),
    ('[experiment]\nname = "s"\ninclude = ["x.toml"]\n', 'only a kind = "suite"'),
])
def test_bad_suites_are_one_line(text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        parse(text, "s.toml")
    assert "\n" not in str(info.value)


# Each value that `gpuvm run` takes as a flag and an experiment file as a key gets the
# same checks: what the flag refuses, the key refuses, before anything runs.
@pytest.mark.parametrize("flag, change", [
    (["-b", "loop", "--size", "0"], ("params = [1000, 3]", "params = [0, 3]")),
    (["-b", "loop", "--timeout", "inf"], ("time_scale = 2", "time_scale = 2\ntimeout_s = inf")),
    (["-b", "loop", "--timeout", "0"], ("time_scale = 2", "time_scale = 2\ntimeout_s = 0")),
    (["-b", "loop", "--time-scale", "0"], ("time_scale = 2", "time_scale = 0")),
    (["-b", "loop", "--time-scale", "nan"], ("time_scale = 2", "time_scale = nan")),
    (["--vm", "bench=loop,share=0"], ("share = 2", "share = 0")),
    (["--vm", "bench=loop,share=inf"], ("share = 2", "share = inf")),
    (["-b", "loop", "--vram-mib", "0"], ("time_scale = 2", "time_scale = 2\nvram_mib = 0")),
    (["-b", "loop", "--type", "gpuvm-nope"],
     ("partition = { vram_mib = 256, channels = 4 }", "type = \"gpuvm-nope\"")),
    (["-b", "loop", "--inject", "nothing"], ("count = 2", "count = 2\ninject = \"nothing\"")),
    (["-b", "loop", "--ram-alloc", "lazy"], ("count = 2", "count = 2\nram_alloc = \"lazy\"")),
    (["-b", "loop", "--policy", "lottery"], ("policies = [\"band\", \"fifo\"]",
                                              "policies = [\"lottery\"]")),
    (["-b", "loop", "--mode", "fast"], ("modes = [\"fv\", \"pv\"]", "modes = [\"fast\"]")),
    (["-b", "loop", "--clock", "sundial"], ("time_scale = 2",
                                            "time_scale = 2\nclock = \"sundial\"")),
    (["-b", "loop", "--backend", "qemu"], ("time_scale = 2",
                                           "time_scale = 2\nbackend = \"qemu\"")),
])
def test_a_value_the_run_flag_refuses_the_file_refuses(flag, change, capsys):
    from gpuvm.cli import main as gpuvm

    try:
        status = gpuvm(["run", *flag])
    except SystemExit as exit_:  # argparse's refusal
        status = exit_.code
    assert status == 2, flag
    assert capsys.readouterr().err.startswith("gpuvm: error:")
    old, new = change
    assert old in GOOD
    with pytest.raises(ConfigError) as exc:
        parse(GOOD.replace(old, new, 1), "good.toml")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("good.toml: ")
