"""[profiler] --profile-steps A:B traces updates A+1 to B: the trace in
<out-dir>/profile holds B - A optimizer updates and the DataLoader's waits, and the
run prints its summary. Without the flag nothing is profiled; a bad window is refused.
"""

import json

import pytest

import train
from conftest import run_main


def test_the_trace_holds_the_updates_of_the_window(tmp_path, capsys):
    # 64 samples, batches of 8: 8 updates; update 2 warms up, 3 to 5 are traced
    run_main(tmp_path, "--epochs", 1, "--profile-steps", "2:5")
    traces = list((tmp_path / "profile").glob("*.pt.trace.json"))
    assert [p.name for p in traces] == ["rank0.pt.trace.json"]
    names = [
        e.get("name", "") for e in json.loads(traces[0].read_text())["traceEvents"]
    ]
    # the profiler's step k is update k + 1
    steps = {n for n in names if n.startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"}
    assert sum(n.startswith("Optimizer.step#") for n in names) == 3
    assert any(n.startswith("enumerate(DataLoader)") for n in names)
    out = capsys.readouterr().out
    assert "[profiler] waiting for data: " in out and "Self CPU" in out


def test_without_the_flag_nothing_is_profiled(tmp_path, monkeypatch):
    def no_profiler(*args, **kwargs):
        raise AssertionError("a profiler was made without --profile-steps")

    monkeypatch.setattr(train, "profile", no_profiler)
    run_main(tmp_path, "--max-steps", 2)
    assert not (tmp_path / "profile").exists()


@pytest.mark.parametrize("window", ["5", "0:3", "4:4", "3:2", "a:b", "2:5:7"])
def test_a_malformed_window_is_refused(window):
    with pytest.raises(ValueError, match="--profile-steps must be A:B, 1 <= A < B"):
        train.Config(profile_steps=window)
