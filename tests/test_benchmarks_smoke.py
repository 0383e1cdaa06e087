"""The benchmark scripts still run (benchmarks/, --quick sizes). Timings are never checked here:
only that every script finishes, every row was measured (none failed), and the report says when
and where it was made."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "benchmarks"


def lightning_installed() -> bool:
    return importlib.util.find_spec("lightning") is not None


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SCAFFOLD_BENCH_SMOKE") != "1",
    reason="about 1-5 min of training runs: set SCAFFOLD_BENCH_SMOKE=1 to run it",
)
def test_cpu_benchmarks_quick(tmp_path):
    out = tmp_path / "cpu.md"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = out.read_text()
    assert re.search(r"- Date: \d{4}-\d\d-\d\d", text) and "- Machine: " in text
    assert "torch " in text and "Load average" in text
    for heading in ("## Training throughput on CPU", "## Start-up", "## CLI latency",
                    "## FSDP against DDP on the CPU"):  # fmt: skip
        assert heading in text, heading
    # Every table row is a measurement: a failed variant is reported as "failed", never dropped.
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert not [row for row in rows if "failed" in row], text
    measured = {row.split(" | ")[0].lstrip("| ") for row in rows}
    expected = {
        "(1) hand-written loop",
        "(2) scaffold `minimal`",
        "(2) scaffold `amp+grad-accum`",
        "(2) scaffold `all-ddp`",
        "(1) hand-written loop + accumulation, clipping, schedule",
        "scaffold `minimal`: python train.py",
        "scaffold --help",
        "scaffold new DIR --defaults",
        "DDP, 2 CPU processes (gloo)",
        "FSDP, 2 CPU processes (gloo)",
    }
    if lightning_installed():
        expected |= {"(3) Lightning, like `minimal`", "(3) Lightning, like `all`",
                     "Lightning Trainer (like `minimal`)"}  # fmt: skip
    assert expected <= measured, expected - measured
    # a row's number is a number: "ms/update (median)" of the floor
    floor = next(row for row in rows if row.startswith("| (1) hand-written loop |"))
    assert float(floor.split(" | ")[1]) > 0


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("SCAFFOLD_BENCH_SMOKE") != "1",
    reason="about 2 min of training runs: set SCAFFOLD_BENCH_SMOKE=1 to run it",
)
def test_gpu_benchmark_cpu_dry_run(tmp_path):
    """The GPU mode end to end on the CPU: every setup measured (1 process, DDP and FSDP on 2
    gloo processes), none failed, memory per rank reported."""
    out = tmp_path / "gpu.md"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu.py"), "--cpu-dry-run", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in out.read_text().splitlines() if line.startswith("| ")]
    assert not [row for row in rows if "failed" in row], rows
    for setup in ("| 1 GPU | fp32 |", "| 1 GPU | bf16 |", "| DDP, 2 GPU(s), torchrun | bf16 |",
                  "| FSDP, 2 GPU(s), torchrun | bf16 |"):  # fmt: skip
        assert any(row.startswith(setup) for row in rows), (setup, rows)


@pytest.mark.slow
def test_gpu_benchmark_quick(tmp_path):
    """Without CUDA: a message, status 0, nothing written. With CUDA: a table without failures."""
    out = tmp_path / "gpu.md"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu.py"), "--quick", "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    if "CUDA is not available" in proc.stdout:
        assert not out.exists()
        if Path("/dev/nvidiactl").exists():  # a GPU machine: the message must be true
            import torch

            assert not torch.cuda.is_available()
        return
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert not [row for row in rows if "failed" in row], text
    assert any(row.startswith("| 1 GPU | bf16 |") for row in rows), text
    assert any(row.startswith("| DDP,") for row in rows), text
