"""Distributed runs under the faults machines and people cause (issue 28), with REAL torchrun.

The project is the default image task (a small CNN with BatchNorm) with fsdp + resume: the case
where each rank keeps buffers of its own. Runs (started together; one torch import each):
- `reference`: 2 ranks, uninterrupted;
- the chain: its twin, paused by tests/test_ddp.py's HOOK inside update 7 (last.pt is step 6,
  mid-epoch), then kill -9 of torchrun AND both ranks (what a scheduler or a node failure does),
  resumed with torchrun: final.pt must equal the reference bitwise, parameters AND buffers;
- `orphans`: paused inside update 2; while it holds the out-dir, a second training on the same
  folder must be refused in one line naming rank 0's pid and host, writing nothing; then the
  launcher is killed as a person would (kill -9 of torchrun's process group, which does not reach
  ranks in sessions of their own): both ranks must be gone within seconds; and a new training on
  the folder the dead run held (its .lock left behind) starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import traceback
from pathlib import Path

import pytest

from conftest import REPO
from test_ddp import (ACCUM_ARGS, PER_RANK_BATCH, RUN_TIMEOUT, TRAIN, Run, bitwise_equal, clean_env, final_model,
                      kill_all, make_project, max_relative_difference, torchrun, wait_ok, wait_paused)

pytestmark = pytest.mark.slow

BATCH = 8  # per rank
# 64 training images: 32 per rank, 4 updates per epoch, 8 in 2 epochs; saves at steps 2, 4, 6, 8
ARGS = ["--synthetic-train-size", "64", "--synthetic-val-size", "32", "--epochs", "2", "--batch-size", str(BATCH),
        "--checkpoint-every", "2", "--log-every", "1", "--device", "cpu", "--num-workers", "0"]
KILL_IN_UPDATE = 7  # of the chain: last.pt is step 6's (epoch 2, after 2 of its 4 updates)


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie waits for a reaper here)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def paused_run(project: Path, out_dir: Path, tmp: Path, name: str, update: int) -> tuple[Run, Path]:
    hook_dir = tmp / f"hook-{name}"
    hook_dir.mkdir()
    run = torchrun(project, [*ARGS, "--out-dir", str(out_dir)], tmp / f"{name}.log",
                   DDP_TEST_HOOK_DIR=hook_dir, DDP_TEST_PAUSE_AT=(update - 1) * BATCH + 1)
    return run, hook_dir


def chain(project: Path, tmp: Path, facts: dict) -> None:
    out_dir = facts["chain_out"] = tmp / "out-chain"
    run, hook_dir = paused_run(project, out_dir, tmp, "chain", KILL_IN_UPDATE)
    facts["runs"].append(run)
    workers = wait_paused(run, hook_dir)
    kill_all([run.proc.pid, *workers])  # every process of the job, as a scheduler does
    run.proc.wait(timeout=30)
    import torch

    facts["killed_at"] = torch.load(out_dir / "last.pt", map_location="cpu", weights_only=True)["step"]
    resume = torchrun(project, [*ARGS, "--out-dir", str(out_dir)], tmp / "chain-resume.log")
    facts["runs"].append(resume)
    facts["resume_log"] = wait_ok(resume, "resume after kill -9")


def orphans(project: Path, tmp: Path, facts: dict) -> None:
    out_dir = facts["orphans_out"] = tmp / "out-orphans"
    run, hook_dir = paused_run(project, out_dir, tmp, "orphans", 2)
    facts["runs"].append(run)
    workers = facts["workers"] = wait_paused(run, hook_dir)
    config = (out_dir / "config.json").read_text()
    second = Run(project, ["python", "train.py", *ARGS, "--out-dir", str(out_dir)], tmp / "second.log", clean_env())
    facts["second_code"] = second.wait()
    facts["second_log"] = second.output()
    facts["config_kept"] = (out_dir / "config.json").read_text() == config
    os.killpg(run.proc.pid, signal.SIGKILL)  # torchrun's group: its ranks are in sessions of their own
    run.proc.wait(timeout=30)
    killed = time.monotonic()
    while any(alive(pid) for pid in workers) and time.monotonic() - killed < 30:
        time.sleep(0.05)
    facts["ranks_alive_after"] = [pid for pid in workers if alive(pid)]
    facts["ranks_gone_in_s"] = time.monotonic() - killed
    kill_all(workers)  # whatever the outcome, nothing trains on after the test
    # the folder is free: the dead run's .lock is left behind, and taken over
    third = Run(project, ["python", "train.py", *ARGS, "--out-dir", str(out_dir), "--resume", "never",
                          "--max-steps", "1"], tmp / "third.log", clean_env())
    facts["third_code"] = third.wait()
    facts["third_log"] = third.output()


def other_world_size(kind: str, tmp: Path, facts: dict) -> None:
    """2 ranks killed mid-epoch, finished by 1 process with the same global batch; and the
    uninterrupted 2-rank reference. Both observed by HOOK (the fetched sample indices)."""
    project = make_project(tmp / f"text-{kind}", "text-classification", [kind, "grad-accum", "resume"], hook=True)
    b = PER_RANK_BATCH
    args = list(ACCUM_ARGS)  # no amp: float32
    args += ["--batch-size", str(b)]
    hooks = {name: tmp / f"hook-{kind}-{name}" for name in ("reference", "killed", "finished")}
    for folder in hooks.values():
        folder.mkdir()
    out = {name: tmp / f"out-{kind}-{name}" for name in ("reference", "chain")}
    reference = torchrun(project, [*args, "--out-dir", str(out["reference"])], tmp / f"{kind}-reference.log",
                         DDP_TEST_HOOK_DIR=hooks["reference"])
    facts["runs"].append(reference)
    # inside update 6: epoch 2's 5th micro-batch of rank 0 (see tests/test_ddp.py's chain)
    killed = torchrun(project, [*args, "--out-dir", str(out["chain"])], tmp / f"{kind}-killed.log",
                      DDP_TEST_HOOK_DIR=hooks["killed"], DDP_TEST_PAUSE_AT=TRAIN // 2 + 4 * b + 1)
    facts["runs"].append(killed)
    workers = wait_paused(killed, hooks["killed"])
    kill_all([killed.proc.pid, *workers])
    killed.proc.wait(timeout=30)
    import torch

    facts[f"{kind}_killed"] = torch.load(out["chain"] / "last.pt", map_location="cpu", weights_only=True)
    refused = Run(project, ["python", "train.py", *args, "--out-dir", str(out["chain"])],
                  tmp / f"{kind}-refused.log", clean_env())
    facts[f"{kind}_refused"] = (refused.wait(), refused.output())
    finished = Run(project, ["python", "train.py", *args, "--grad-accum-steps", "4", "--out-dir", str(out["chain"])],
                   tmp / f"{kind}-finished.log", clean_env(DDP_TEST_HOOK_DIR=hooks["finished"]))
    facts["runs"].append(finished)
    facts[f"{kind}_finished_log"] = wait_ok(finished, f"{kind}: 1 process resuming a 2-rank checkpoint")
    facts[f"{kind}_reference_log"] = wait_ok(reference, f"{kind}: the 2-rank reference")
    facts[f"{kind}_out"] = out
    facts[f"{kind}_fetched"] = {name: [json.loads((hooks[name] / f"rank{r}.json").read_text())["fetched"]
                                       for r in ranks] for name, ranks in (("reference", (0, 1)), ("finished", (0,)))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    project = make_project(tmp / "image-fsdp", "image-classification", ["fsdp", "resume"], hook=True)
    facts = {"runs": [], "errors": []}

    def thread(target):
        def body():
            try:
                target(project, tmp, facts)
            except BaseException:
                facts["errors"].append(traceback.format_exc())

        started = threading.Thread(target=body, daemon=True)
        started.start()
        return started

    threads = [thread(chain), thread(orphans)]
    for kind in ("ddp", "fsdp"):
        threads.append(thread(lambda _, tmp, facts, kind=kind: other_world_size(kind, tmp, facts)))
    reference = torchrun(project, [*ARGS, "--out-dir", str(tmp / "out-reference")], tmp / "reference.log")
    facts["runs"].append(reference)
    try:
        facts["reference_log"] = wait_ok(reference, "reference")
        for started in threads:
            started.join(timeout=4 * RUN_TIMEOUT)
    finally:
        for run in facts["runs"]:
            if run.proc.poll() is None:
                run.kill()
    assert not facts["errors"], "\n".join(facts["errors"])
    return {"tmp": tmp, **facts}


def test_kill9_of_every_process_then_resume_is_bitwise_with_batchnorm_buffers(runs):
    assert runs["killed_at"] == KILL_IN_UPDATE - 1
    assert f"resumed from {runs['chain_out'] / 'last.pt'}: step {KILL_IN_UPDATE - 1}" in runs["resume_log"]
    reference, resumed = final_model(runs["tmp"] / "out-reference"), final_model(runs["chain_out"])
    buffers = [k for k in reference if "running_" in k]
    assert len(buffers) >= 4, "the model has no BatchNorm statistics to check"
    different = [k for k in reference if not bitwise_equal({k: reference[k]}, {k: resumed[k]})]
    assert different == [], f"differ after kill -9 and resume: {different}"


def test_a_second_training_on_a_held_out_dir_is_refused_in_one_line(runs):
    lines = runs["second_log"].strip().splitlines()
    assert runs["second_code"] == 1, runs["second_log"]
    rank0 = runs["workers"][0]
    expected = (f"error: another training is writing to {runs['orphans_out']} "
                f"(pid {rank0} on {socket.gethostname()}): wait for it, stop it, or use another --out-dir")
    assert lines == [expected], lines
    assert runs["config_kept"], "the refused training wrote config.json"


def test_killing_torchrun_stops_its_ranks(runs):
    assert runs["ranks_alive_after"] == [], f"ranks trained on for {runs['ranks_gone_in_s']:.1f} s"
    assert runs["ranks_gone_in_s"] < 10


def test_a_stale_hold_is_taken_over(runs):
    assert (runs["orphans_out"] / ".lock").is_file()
    assert runs["third_code"] == 0, runs["third_log"][-3000:]
    assert "done: 1 updates" in runs["third_log"]


def test_launch_scripts_say_how_to_stop_every_rank():
    """launch.sh and launch_slurm.sh tell how a job is stopped so that every rank stops."""
    templates = REPO / "templates" / "project"
    launch = (templates / "{% if ddp or fsdp %}launch.sh{% endif %}.jinja").read_text()
    slurm = (templates / "{% if ddp or fsdp %}launch_slurm.sh{% endif %}.jinja").read_text()
    assert "PR_SET_PDEATHSIG" in launch and "scancel" in slurm, json.dumps([launch[:400], slurm[:400]])


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_two_ranks_resumed_on_one_process_with_the_same_global_batch(runs, kind):
    killed = runs[f"{kind}_killed"]
    assert (killed["step"], killed["epoch"], killed["batches_done"]) == (4, 1, 2)  # mid-epoch 2
    assert "step 4, epoch 2, batch 4" in runs[f"{kind}_finished_log"]  # 2 x 2 micro-batches of 4 = 4 of 4
    out = runs[f"{kind}_out"]
    two, resumed = final_model(out["reference"]), final_model(out["chain"])
    assert max_relative_difference(resumed, two) <= 1e-5  # tests/test_ddp.py's 2 ranks vs 1 process
    # the samples: the reference's two rank streams interleaved are the epoch's global order
    rank0, rank1 = runs[f"{kind}_fetched"]["reference"]
    per_rank = TRAIN // 2
    epochs = [[i for pair in zip(rank0[e:e + per_rank], rank1[e:e + per_rank]) for i in pair]
              for e in range(0, len(rank0), per_rank)]
    skipped = killed["batches_done"] * PER_RANK_BATCH * 2  # the samples epoch 2 had trained on
    expected = [i for epoch in epochs[1:] for i in epoch][skipped:]
    assert runs[f"{kind}_fetched"]["finished"] == [expected], "another sample order after the resume"


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_resume_that_changes_the_global_batch_is_refused_naming_the_numbers(runs, kind):
    code, log = runs[f"{kind}_refused"]
    assert code == 1, log[-2000:]
    expected = ("was written with 2 processes x --batch-size 4 x --grad-accum-steps 2 = 16 samples per update, "
                "this run has 1 process x --batch-size 4 x --grad-accum-steps 2 = 8 samples per update: "
                "keep the global batch (--grad-accum-steps 4) or pass --resume never")
    assert expected in log, log[-2000:]
