"""Feature `fsdp` (issue 22) under REAL torchrun: FSDP2 on the CPU with gloo, 2 processes.

Every run is `torchrun ... train.py` (or `./launch.sh`, or `python train.py`) in a generated text
project (fsdp + grad-accum + resume + amp), so what runs is exactly the generated code. The
`runs` fixture starts the independent runs together (one torch import each is the cost here):
- `equal`: `./launch.sh` (2 ranks, fp32, dropout 0), batch 4: compared with `one`, 1 process
  with batch 8 (tests/runner.py), the same comparison and tolerance as tests/test_ddp.py;
- `reference`: 2 ranks, bf16 (MixedPrecisionPolicy), --activation-checkpointing, dropout on,
  observed by HOOK (the local shard sizes);
- the chain: the reference's twin, frozen by HOOK on rank 0 right after the shards of its step-8
  checkpoint are written and before last.pt names them (the window a crash mid-save hits), then
  kill -9 of torchrun and both workers; resumed with torchrun, it must end bitwise equal to the
  reference; then its last.pt is resumed by one process with half the global batch: refused.

The text model (no BatchNorm; dropout 0 where runs are compared across process counts) is
explained in tests/test_ddp.py, whose helpers this module reuses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import run_jobs
from test_ddp import (ACCUM_ARGS, ACCUM_UPDATES, DROPOUT, PER_RANK_BATCH, RUN_TIMEOUT, Run, bitwise_equal,
                      clean_env, descendants, final_model, kill_all, make_project, max_relative_difference,
                      read_metrics, torchrun, val_rows, wait_ok)

pytestmark = pytest.mark.slow

FEATURES = ["fsdp", "grad-accum", "resume", "amp"]
FP32 = ["--precision", "fp32", "--dropout", "0"]
# bf16 gathers and compute, float32 master weights; blocks recomputed in backward
BF16 = ["--precision", "bf16", "--activation-checkpointing", *DROPOUT]
# Saves (--checkpoint-every 4, 3 updates per epoch): step 3 (epoch end), 4, 6 (epoch end), 8, 9.
KILL_AT_SAVE = 4  # step 8's: last.pt must still name step 6's shards

HOOK = '''

# ---- observation hook appended by tests/test_fsdp.py (not generated code; changes no number) ----
import json as _json
import os as _os
import time as _time

import torch.distributed.checkpoint as _dcp
from torch.optim.optimizer import register_optimizer_step_pre_hook as _register_step_hook

_HOOK_DIR = _os.environ.get("FSDP_TEST_HOOK_DIR")
_RANK = int(_os.environ.get("RANK", "0"))
_FREEZE_AT_SAVE = int(_os.environ.get("FSDP_TEST_FREEZE_AT_SAVE", "0"))
_saves = []


def _record_shard_sizes(optimizer, args, kwargs):
    # what this rank stores of the parameters: its local shards (DTensor.to_local())
    params = [p for group in optimizer.param_groups for p in group["params"]]
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    sizes = {"local": local, "full": sum(p.numel() for p in params)}
    Path(_HOOK_DIR, f"rank{_RANK}.json").write_text(_json.dumps(sizes))


_generated_save = _dcp.save


def _save(*args, **kwargs):
    result = _generated_save(*args, **kwargs)
    _saves.append(kwargs.get("checkpoint_id"))
    if _RANK == 0 and len(_saves) == _FREEZE_AT_SAVE:
        # every rank's shards are written, last.pt does not name them yet: wait to be killed
        Path(_HOOK_DIR, "frozen").write_text(str(_saves[-1]))
        while True:
            _time.sleep(1)
    return result


if _HOOK_DIR:
    Path(_HOOK_DIR, f"rank{_RANK}.pid").write_text(str(_os.getpid()))
    _dcp.save = _save
    _register_step_hook(_record_shard_sizes)
'''


def hooked(project: Path, args: list[str], log: Path, hook_dir: Path, **env) -> Run:
    hook_dir.mkdir()
    return torchrun(project, args, log, FSDP_TEST_HOOK_DIR=hook_dir, **env)


def last_state(out_dir: Path) -> dict:
    import torch

    return torch.load(Path(out_dir) / "last.pt", map_location="cpu", weights_only=True)


def chain(project: Path, tmp: Path, args: list[str], facts: dict) -> None:
    out_dir = facts["out_dir"] = tmp / "out-chain"
    hook_dir = tmp / "hook-frozen"
    run = hooked(project, [*args, "--out-dir", str(out_dir)], tmp / "frozen.log", hook_dir,
                 FSDP_TEST_FREEZE_AT_SAVE=KILL_AT_SAVE)
    facts["runs"].append(run)
    deadline = time.monotonic() + RUN_TIMEOUT
    while not (hook_dir / "frozen").exists():
        if run.proc.poll() is not None or time.monotonic() > deadline:
            run.kill()
            raise AssertionError(f"the run never reached save {KILL_AT_SAVE}:\n{run.output()[-4000:]}")
        time.sleep(0.05)
    # kill -9 torchrun and every worker, as a node failure would (see tests/test_ddp.py)
    kill_all([run.proc.pid, *descendants(run.proc.pid)])
    run.proc.wait(timeout=30)
    facts["frozen_shards"] = (hook_dir / "frozen").read_text()
    facts["killed_state"] = last_state(out_dir)
    facts["killed_folders"] = sorted(p.name for p in (out_dir / "shards").iterdir())
    shutil.copy(out_dir / "last.pt", tmp / "killed-last.pt")  # for the world-size refusal
    resume = torchrun(project, [*args, "--out-dir", str(out_dir)], tmp / "resume.log")
    facts["runs"].append(resume)
    facts["resume_log"] = wait_ok(resume, "resume after kill -9")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import threading
    import traceback

    tmp = tmp_path_factory.mktemp("fsdp")
    project = make_project(tmp / "text-fsdp", "text-classification", FEATURES, hook=False)
    with open(project / "data.py", "a") as f:
        f.write(HOOK)
    b = PER_RANK_BATCH
    out = {name: tmp / f"out-{name}" for name in ("equal", "one", "reference", "refused")}
    bf16_args = [*ACCUM_ARGS, *BF16, "--batch-size", str(b)]
    facts = {"runs": [], "error": None}

    def chain_thread():
        try:
            chain(project, tmp, bf16_args, facts)
        except BaseException:
            facts["error"] = traceback.format_exc()

    thread = threading.Thread(target=chain_thread, daemon=True)
    thread.start()
    started = []
    try:
        # launch.sh: `torchrun --standalone --nproc-per-node ${NPROC:-2}` without GPUs
        started.append(equal := Run(
            project, ["bash", "launch.sh", *ACCUM_ARGS, *FP32, "--batch-size", str(b), "--out-dir", str(out["equal"])],
            tmp / "equal.log", clean_env()))
        started.append(reference := hooked(
            project, [*bf16_args, "--out-dir", str(out["reference"])], tmp / "reference.log", tmp / "hook-reference"))
        jobs = [{"project": project, "args": [*ACCUM_ARGS, *FP32, "--batch-size", str(2 * b), "--out-dir", str(out["one"])]}]
        single = dict(zip(["one"], run_jobs(jobs, tmp, timeout=2 * RUN_TIMEOUT)))
        thread.join(timeout=3 * RUN_TIMEOUT)
        if (tmp / "killed-last.pt").exists():  # a 2-process checkpoint resumed by 1 process
            jobs = [{"project": project, "args": [*bf16_args, "--out-dir", str(out["refused"]),
                                                  "--resume", str(tmp / "killed-last.pt")]}]
            single["refused"] = run_jobs(jobs, tmp, timeout=RUN_TIMEOUT)[0]
        logs = {"equal": (equal.wait(), equal.output()), "reference": (reference.wait(), reference.output())}
    finally:
        for run in [*started, *facts["runs"]]:
            if run.proc.poll() is None:
                run.kill()
    return {"tmp": tmp, "project": project, "out": out, "logs": logs, "single": single, "chain": facts}


def finished(runs, name: str) -> Path:
    if name in runs["single"]:
        result = runs["single"][name]
        assert result["ok"], f"{name}: {result['error']}\n{result['stdout']}"
    else:
        code, log = runs["logs"][name]
        assert code == 0, f"{name} exited {code}:\n{log[-4000:]}"
    return runs["out"][name]


def chain_facts(runs) -> dict:
    facts = runs["chain"]
    assert facts["error"] is None, facts["error"]
    return facts


def test_two_ranks_equal_one_process_with_twice_the_batch(runs):
    """launch.sh (2 ranks x batch 4 x 2 micro-batches, sharded) == 1 process x batch 8 x 2
    micro-batches: 9 updates with a shorter last window each epoch; the same tolerance as the ddp
    test. final.pt holds the whole model under plain names, gathered on rank 0, and loads with
    weights_only=True in this one process (final_model)."""
    two, one = final_model(finished(runs, "equal")), final_model(finished(runs, "one"))
    assert max_relative_difference(two, one) <= 1e-5
    for a, b in zip(val_rows(runs["out"]["equal"]), val_rows(runs["out"]["one"]), strict=True):
        for name in ("val_loss", "val_acc"):  # 37 samples: shards of 19 and 18, counted once
            assert float(a[name]) == pytest.approx(float(b[name]), rel=1e-6, abs=0), (name, a, b)
    lines, rows = read_metrics(runs["out"]["equal"])
    assert [int(r["step"]) for r in rows if r["train_loss"]] == list(range(1, ACCUM_UPDATES + 1))


def test_each_rank_stores_about_half_of_the_parameters(runs):
    """Sharded per block: each rank's local shards hold about 1/2 of the parameters, and together
    exactly all of them (measured with DTensor.to_local() at an optimizer step)."""
    finished(runs, "reference")
    sizes = [json.loads((runs["tmp"] / "hook-reference" / f"rank{r}.json").read_text()) for r in (0, 1)]
    full = sizes[0]["full"]
    assert sizes[1]["full"] == full > 1000
    assert sizes[0]["local"] + sizes[1]["local"] == full
    for size in sizes:
        assert 0.45 < size["local"] / full < 0.55, sizes


def test_kill9_mid_save_then_resume_ends_bitwise_equal(runs):
    """Frozen after step 8's shards were written but before last.pt named them, then kill -9: last.pt
    still names step 6's complete shards, the resume continues there (bf16 mixed precision,
    activation checkpointing, dropout: each rank's own generator) and ends bitwise equal to the
    uninterrupted run. Afterwards only the folder last.pt names is left."""
    facts = chain_facts(runs)
    assert facts["frozen_shards"].endswith("step-0000008-2-4")
    assert facts["killed_state"]["step"] == 6
    assert facts["killed_state"]["shards"] == "shards/step-0000006-2-0"
    assert "step-0000008-2-4" in facts["killed_folders"]  # complete, but never named
    assert "resumed from" in facts["resume_log"] and "step 6, epoch 3, batch 0" in facts["resume_log"]
    assert bitwise_equal(final_model(facts["out_dir"]), final_model(finished(runs, "reference")))
    reference_rows = [r for r in read_metrics(runs["out"]["reference"])[1] if r["val_loss"]]
    assert [r for r in read_metrics(facts["out_dir"])[1] if r["val_loss"]] == reference_rows
    named = last_state(facts["out_dir"])["shards"]
    assert [f"shards/{p.name}" for p in (facts["out_dir"] / "shards").iterdir()] == [named]


def test_resume_with_another_world_size_is_refused(runs):
    """A last.pt written by 2 processes, resumed by `python train.py` (1 process) with half the global
    batch: refused, naming the numbers and the flag that keeps the global batch."""
    chain_facts(runs)
    refused = runs["single"].get("refused")
    assert refused is not None and refused["exit_code"] == 1, refused
    # another number of ranks may resume only with the same global batch (tests/test_faults.py)
    assert "written with 2 processes x --batch-size" in refused["error"], refused["error"]
    assert "this run has 1 process x --batch-size" in refused["error"], refused["error"]
    assert "keep the global batch (--grad-accum-steps " in refused["error"], refused["error"]
    assert not (runs["out"]["refused"] / "last.pt").exists()


def test_slurm_script_is_valid_bash(runs):
    check = subprocess.run(["bash", "-n", str(runs["project"] / "launch_slurm.sh")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
