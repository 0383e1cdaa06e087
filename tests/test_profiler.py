"""Feature `profiler` (issue 29, item 8) under a real torchrun: 2 ranks over gloo, with grad-accum.

Each rank writes its own trace of the window's optimizer updates (not of its micro-batches), with the
DataLoader's waits in it, and rank 0 alone prints the summary. The one-process guarantees (exactly
updates A+1..B traced, nothing profiled without the flag, a malformed window refused) are the
project's own `tests/test_profiler.py`, run by tests/test_generated_suite.py; here it also runs once
in the rendered project, so that the fast subset runs the feature's code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import render_project

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
TINY = ["--device", "cpu", "--batch-size", "4", "--synthetic-train-size", "64"]
TINY += ["--synthetic-val-size", "16", "--image-size", "16", "--epochs", "1"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _names(trace: Path) -> list[str]:
    return [event.get("name", "") for event in json.loads(trace.read_text())["traceEvents"]]


def test_every_rank_traces_the_window_and_rank_0_prints_the_summary(tmp_path):
    project = render_project(tmp_path / "p", features=["profiler", "ddp", "grad-accum"])
    # the project's own one-process tests of the feature, as a user runs them
    own = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_profiler.py"], cwd=project, capture_output=True, text=True,
                         env=_env(), timeout=600)
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-3000:]

    # 64 samples over 2 ranks, batches of 4, windows of 2: 4 updates; update 1 warms up, 2-3 traced
    out = tmp_path / "out"
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "train.py", *TINY,
           "--grad-accum-steps", "2", "--profile-steps", "1:3", "--out-dir", str(out)]
    run = subprocess.run(cmd, cwd=project, capture_output=True, text=True, env=_env(), timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    traces = sorted(p.name for p in (out / "profile").iterdir())
    assert traces == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    for name in traces:
        names = _names(out / "profile" / name)
        # two updates of two micro-batches each: two optimizer steps
        assert sum(n.startswith("Optimizer.step#") for n in names) == 2, name
        assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#1",
                                                                       "ProfilerStep#2"}, name
        assert any(n.startswith("enumerate(DataLoader)") for n in names), name
    assert run.stdout.count("[profiler] waiting for data: ") == 1, run.stdout[-3000:]
    assert "4 optimizer updates" in run.stdout
