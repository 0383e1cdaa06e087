"""Feature `ddp` (issue 6) under REAL torchrun: gloo backend, CPU, 2 processes on this machine.

Every run is `torchrun ... train.py` (or `python train.py`) in a generated project, so what runs is
exactly the generated code. Every process imports torch, which costs many seconds on this loaded
2-core machine, so the `runs` fixture starts the independent runs together and the tests read
their outputs:
- `reference`: 2 ranks on one node, text ddp+grad-accum+resume, dropout on, observed by HOOK;
- `node0`/`node1`: the same project as two nodes (two torchrun agents, 1 process each), dropout 0;
- `tokens-2`: 2 ranks, token classification with ddp only (no grad-accum), dropout 0;
- the single-process runs (`python train.py`'s main() of the same projects, one process via
  tests/runner.py): batch 2b references, and a resume of a 2-rank checkpoint with half the global batch (must be refused);
- the chain: the reference's twin killed with -9, resumed, stopped by SIGTERM, resumed to the end.

Why the text tasks and not the image CNN: the image model has BatchNorm, whose training-mode
statistics are per rank (b samples) under DDP but over 2b samples in one process, so "2 ranks ==
1 process" is not even true in theory there. The text models (embedding + transformer encoder
with --encoder transformer, masked pooling, --dropout 0) have no batch statistics and no
randomness in the forward pass, so the two runs compute the same sums, only in a different
floating-point order.

Observation hook: tests append HOOK (below) to a generated copy's data.py (the user-owned file
train.py imports first). It changes no number: it wraps the training set to record which indices
each rank fetched (and can pause both ranks at a given fetch so a test can kill or signal the run
at a known update), counts train.py's dist.all_reduce calls between optimizer steps, and
registers torch's own default all-reduce as a DDP comm hook (the same division by world size and
all-reduce as DDP's built-in one) to count the gradient all-reduce passes. train.py is never
edited here.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from conftest import render_project, run_jobs

pytestmark = pytest.mark.slow

TORCHRUN = [str(Path(sys.executable).parent / "torchrun")]
if not Path(TORCHRUN[0]).exists():
    TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # the same program

RUN_TIMEOUT = 240  # seconds for one torchrun (torch imports are slow on this loaded machine)

# A tiny transformer on built-in synthetic text; dropout 0 (see the module docstring).
TEXT_MODEL = ["--encoder", "transformer", "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2",
              "--dropout", "0",
              "--max-length", "48", "--device", "cpu", "--lr", "0.01", "--warmup-steps", "2"]
# 40 training samples: 20 per rank, no DistributedSampler padding. 37 validation samples: odd,
# so the two ranks' validation shards differ in size (19 and 18).
TRAIN, VAL = 40, 37
PER_RANK_BATCH = 4
# Text, ddp+grad-accum+resume: per rank 5 micro-batches of 4 per epoch = windows of 2, 2, 1
# (a shorter last window), 3 updates per epoch, 9 updates in 3 epochs.
ACCUM_ARGS = [*TEXT_MODEL, "--synthetic-train-size", str(TRAIN), "--synthetic-val-size", str(VAL),
              "--epochs", "3", "--grad-accum-steps", "2", "--log-every", "1", "--checkpoint-every", "4"]
ACCUM_UPDATES, ACCUM_MICRO_BATCHES = 9, 15  # per rank, over the whole run
# Tokens, ddp only (no grad-accum): sentences of 3 to ~40 words, so the two ranks' batches hold
# very different numbers of real tokens; only dividing by the GLOBAL count gives the 1-process gradient.
TOKEN_ARGS = ["--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--dropout", "0",
              "--device", "cpu", "--lr", "0.01", "--warmup-steps", "2",
              "--synthetic-train-size", str(TRAIN), "--synthetic-val-size", "21",
              "--epochs", "2", "--log-every", "1"]
# The reference run and the interrupted chain: dropout on, so every rank draws random numbers in
# every update (of its own batch shapes), and a resume must restore each rank's own generator.
DROPOUT = ["--dropout", "0.1"]

HOOK = '''

# ---- observation hook appended by tests/test_ddp.py (not generated code; changes no number) ----
import atexit as _atexit
import json as _json
import os as _os
import sys as _sys
import time as _time

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as _default_hooks
from torch.nn.parallel import DistributedDataParallel as _DDP
from torch.optim.optimizer import register_optimizer_step_pre_hook as _register_step_hook

_HOOK_DIR = _os.environ.get("DDP_TEST_HOOK_DIR")
_RANK = int(_os.environ.get("RANK", "0"))
_record = {"pid": _os.getpid(), "fetched": [], "allreduce_passes": 0}


class _Recorder(torch.utils.data.Dataset):
    def __init__(self, inner):
        self.inner = inner
        self.pause_at = int(_os.environ.get("DDP_TEST_PAUSE_AT", "0"))

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        _record["fetched"].append(int(index))
        if len(_record["fetched"]) == self.pause_at:
            # every rank waits here (inside an update, before its all-reduce) until the test
            # says go, or kills us
            Path(_HOOK_DIR, f"paused{_RANK}").write_text("")
            while not Path(_HOOK_DIR, "go").exists():
                _time.sleep(0.02)
        return self.inner[index]


def _counting_allreduce(state, bucket):
    # one gradient all-reduce pass over the model ends with its last bucket
    _record["allreduce_passes"] += int(bucket.is_last())
    return _default_hooks.allreduce_hook(state, bucket)


_generated_ddp_init = _DDP.__init__
_generated_all_reduce = torch.distributed.all_reduce
_record["allreduces_between_steps"] = []  # [n]: calls between optimizer steps n+1 and n+2


def _counting_all_reduce(*args, **kwargs):
    # train.py's dist.all_reduce calls (looked up at call time), by the function that made
    # them; DDP's gradient all-reduce is counted by the comm hook above
    caller = _sys._getframe(1)
    if caller.f_code.co_name == "all_reduce_sum":  # train.py's helper: who called it
        caller = caller.f_back
    if _record["allreduces_between_steps"] and caller.f_code.co_filename.endswith("train.py"):
        _record["allreduces_between_steps"][-1].append(caller.f_code.co_name)
    return _generated_all_reduce(*args, **kwargs)


def _on_step(optimizer, args, kwargs):
    _record["allreduces_between_steps"].append([])


def _ddp_init(self, *args, **kwargs):
    _generated_ddp_init(self, *args, **kwargs)
    self.register_comm_hook(None, _counting_allreduce)


def _write_record():
    Path(_HOOK_DIR, f"rank{_RANK}.json").write_text(_json.dumps(_record))


_generated_os_exit = _os._exit


def _os_exit(code):
    # an fsdp rank ends with os._exit (train.py's run_rank), which runs no atexit handler
    _write_record()
    _generated_os_exit(code)


_generated_build_datasets = build_datasets


def build_datasets(cfg):
    train_set, val_set, data_info = _generated_build_datasets(cfg)
    if _HOOK_DIR:
        Path(_HOOK_DIR, f"rank{_RANK}.pid").write_text(str(_os.getpid()))
        _DDP.__init__ = _ddp_init
        torch.distributed.all_reduce = _counting_all_reduce
        _register_step_hook(_on_step)
        _atexit.register(_write_record)
        _os._exit = _os_exit
        train_set = _Recorder(train_set)
    return train_set, val_set, data_info
'''


# --- process helpers ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **{k: str(v) for k, v in extra.items()})
    return env


def descendants(pid: int) -> list[int]:
    """All processes below `pid` (torchrun starts its workers in new sessions, so a process group
    kill of torchrun does not reach them)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Run:
    """A background `torchrun`/`python` process in a project, output to a log file."""

    def __init__(self, project: Path, cmd: list[str], log: Path, env: dict):
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, cwd=project, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"timed out after {timeout} s:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        kill_all([*descendants(self.proc.pid), self.proc.pid])
        self.proc.wait(timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def torchrun(project: Path, args: list[str], log: Path, nproc: int = 2, nodes: tuple = (), port=None,
             **env) -> Run:
    """torchrun with a c10d rendezvous on 127.0.0.1:<free port>; nodes=(nnodes, node_rank)."""
    port = port or free_port()
    cmd = [*TORCHRUN, "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"ddp-test-{port}"]
    if nodes:
        cmd += ["--nnodes", str(nodes[0]), "--node-rank", str(nodes[1]), "--local-addr", "127.0.0.1"]
    return Run(project, [*cmd, "train.py", *args], log, clean_env(**env))


def wait_ok(run: Run, what: str) -> str:
    code = run.wait()
    out = run.output()
    assert code == 0, f"{what} exited {code}:\n{out[-4000:]}"
    return out


# Mutation testing of these tests: DDP_TEST_MUTATIONS='[["old", "new"], ...]' (JSON) replaces each
# `old` by `new` in every generated train.py here; each `old` must occur somewhere. E.g. replacing
# "model.no_sync()" by "nullcontext()" must make a test fail. Unset (always in CI): no effect.
MUTATIONS = [tuple(pair) for pair in json.loads(os.environ.get("DDP_TEST_MUTATIONS", "[]"))]
MUTATIONS_APPLIED = set()


def make_project(dest: Path, task: str, features, hook: bool = False) -> Path:
    """Render a project; with `hook`, append HOOK to its data.py."""
    project = render_project(dest, task, features)
    train = (project / "train.py").read_text()
    for old, new in MUTATIONS:
        if old in train:
            train = train.replace(old, new)
            MUTATIONS_APPLIED.add(old)
    (project / "train.py").write_text(train)
    if hook:
        with open(project / "data.py", "a") as f:
            f.write(HOOK)
    return project


def final_model(out_dir: Path) -> dict:
    import torch

    return torch.load(Path(out_dir) / "final.pt", map_location="cpu", weights_only=True)["model"]


def comparable(state: dict) -> dict:
    """The parameters to compare, less the attention KEY bias (the middle third of in_proj_bias):
    softmax ignores a constant added to every score, so its true gradient is zero, and what it
    gets is rounding noise that AdamW divides by its own size (|g| / (sqrt(g^2) + eps)) into
    lr-sized steps. Any change of summation order (one process vs two) moves it by ~1e-3 while
    every other parameter agrees to ~1e-7; with no gradient it also changes no output."""
    import torch

    out = {}
    for name, tensor in state.items():
        if name.endswith("self_attn.in_proj_bias"):
            query, _key, value = tensor.chunk(3)
            tensor = torch.cat([query, value])
        out[name] = tensor
    return out


def max_relative_difference(a: dict, b: dict) -> float:
    """Largest per-tensor ||a - b|| / ||b|| over the compared parameters (float32 tensors)."""
    a, b = comparable(a), comparable(b)
    assert a.keys() == b.keys()
    worst = 0.0
    for name in a:
        diff = (a[name].double() - b[name].double()).norm()
        worst = max(worst, float(diff / b[name].double().norm().clamp(min=1e-30)))
    return worst


def bitwise_equal(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def read_metrics(out_dir: Path) -> tuple[list[str], list[dict]]:
    lines = (Path(out_dir) / "metrics.csv").read_text().splitlines()
    return lines, list(csv.DictReader(lines))


def val_rows(out_dir: Path) -> list[dict]:
    return [r for r in read_metrics(out_dir)[1] if r["val_loss"]]


def expected_rank_order(n: int, epoch: int, rank: int, world_size: int = 2, seed: int = 0) -> list[int]:
    """DistributedSampler's documented order: randperm(n) seeded with seed + epoch, every
    world_size-th index from position `rank` (no padding here: n is divisible)."""
    import torch

    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    return order[rank::world_size]


# --- all runs, started together -------------------------------------------------------------


def last_step(out_dir: Path) -> int:
    import torch

    return torch.load(Path(out_dir) / "last.pt", map_location="cpu", weights_only=True)["step"]


def start_paused(project: Path, out_dir: Path, tmp: Path, name: str, pause_at: int) -> tuple[Run, Path]:
    """A 2-rank text run whose ranks both pause at their `pause_at`-th sample fetch (inside an update,
    before its all-reduce)."""
    hook_dir = tmp / f"hook-{name}"
    hook_dir.mkdir()
    run = torchrun(project, [*ACCUM_ARGS, *DROPOUT, "--batch-size", str(PER_RANK_BATCH), "--out-dir", str(out_dir)],
                   tmp / f"{name}.log", DDP_TEST_HOOK_DIR=hook_dir, DDP_TEST_PAUSE_AT=pause_at)
    return run, hook_dir


def wait_paused(run: Run, hook_dir: Path) -> list[int]:
    """Wait until both ranks paused; return the workers' pids (rank 0, rank 1)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while not all((hook_dir / f"paused{r}").exists() for r in (0, 1)):
        if run.proc.poll() is not None or time.monotonic() > deadline:
            run.kill()
            raise AssertionError(f"the run never paused:\n{run.output()[-4000:]}")
        time.sleep(0.05)
    return [int((hook_dir / f"rank{r}.pid").read_text()) for r in (0, 1)]


def chain(project: Path, tmp: Path, facts: dict) -> None:
    """One 2-rank run of the text project, interrupted twice, resumed with torchrun each time:
    1. kill -9 inside update 6: last.pt is at step 4, so update 5 is lost and must be redone;
    2. the resume gets SIGTERM on rank 1 ONLY, inside update 7 before its all-reduce: the stop flag
       summed in that all-reduce must stop rank 0 after the same update, rank 0 saves last.pt at
       step 7, the workers exit 75;
    3. the last resume runs to the end (its final.pt is compared with the uninterrupted run)."""
    out_dir = facts["out_dir"] = tmp / "out-chain"
    per_epoch, b = TRAIN // 2, PER_RANK_BATCH
    args = [*ACCUM_ARGS, *DROPOUT, "--batch-size", str(b), "--out-dir", str(out_dir)]

    # 1. epoch 2's 5th micro-batch (the window of update 6) is rank 0's fetch per_epoch + 4b + 1
    run, hook_dir = start_paused(project, out_dir, tmp, "killed", per_epoch + 4 * b + 1)
    facts["runs"].append(run)
    workers = wait_paused(run, hook_dir)
    # torchrun starts its workers in sessions of their own, so killing its process group would
    # miss them: kill -9 torchrun AND every worker, as a node failure or an OOM kill of the job would
    kill_all([run.proc.pid, *workers])
    run.proc.wait(timeout=30)
    facts["killed_last_step"] = last_step(out_dir)
    facts["killed_logged_steps"] = [int(r["step"]) for r in read_metrics(out_dir)[1]]
    shutil.copy(out_dir / "last.pt", tmp / "killed-last.pt")  # for the world-size refusal job
    facts["killed"].set()

    # 2. the resumed run starts at step 4 (epoch 2, after micro-batch 2) and fetches: update 5
    # (fetches 1..2b), update 6 (the short window, 2b+1..3b), then update 7 from fetch 3b + 1
    run, hook_dir = start_paused(project, out_dir, tmp, "sigterm", 3 * b + 1)
    facts["runs"].append(run)
    _, rank1 = wait_paused(run, hook_dir)
    os.kill(rank1, signal.SIGTERM)  # both ranks wait at their first fetch of update 7
    (hook_dir / "go").write_text("")
    facts["sigterm_code"] = run.wait()
    facts["sigterm_log"] = run.output()
    facts["sigterm_last_step"] = last_step(out_dir)

    # 3. no hook: the plain generated code
    resume = torchrun(project, args, tmp / "final-resume.log")
    facts["runs"].append(resume)
    facts["final_log"] = wait_ok(resume, "resume after SIGTERM")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    projects = {
        "accum": make_project(tmp / "text-accum", "text-classification", ["ddp", "grad-accum", "resume"], hook=True),
        "tokens": make_project(tmp / "tokens-ddp", "token-classification", ["ddp"]),
    }
    assert MUTATIONS_APPLIED == {old for old, _ in MUTATIONS}, "a DDP_TEST_MUTATIONS string is not in train.py"
    out = {name: tmp / f"out-{name}" for name in ("reference", "node0", "node1", "accum-1", "accum-1-small",
                                                  "tokens-2", "tokens-1", "refused")}
    hook_dir = tmp / "hook-reference"
    hook_dir.mkdir()
    b = PER_RANK_BATCH
    facts = {"runs": [], "error": None, "killed": threading.Event()}

    def chain_thread():
        try:
            chain(projects["accum"], tmp, facts)
        except BaseException:
            facts["error"] = traceback.format_exc()
        finally:
            facts["killed"].set()

    # the chain is the longest (three torchruns in a row): it starts first
    thread = threading.Thread(target=chain_thread, daemon=True)
    thread.start()
    started = []
    try:
        # the uninterrupted twin of the chain (dropout on), observed by the hook
        started.append(reference := torchrun(
            projects["accum"], [*ACCUM_ARGS, *DROPOUT, "--batch-size", str(b), "--out-dir", str(out["reference"])],
            tmp / "reference.log", DDP_TEST_HOOK_DIR=hook_dir))
        # two "nodes": two torchrun agents on this machine meeting at one c10d rendezvous, 1 process
        # each; each node gets its own --out-dir, so the files show who wrote (only global rank 0 may)
        port = free_port()
        started += (nodes := [
            torchrun(projects["accum"], [*ACCUM_ARGS, "--batch-size", str(b), "--out-dir", str(out[f"node{r}"])],
                     tmp / f"node{r}.log", nproc=1, nodes=(2, r), port=port) for r in (0, 1)])
        started.append(tokens := torchrun(
            projects["tokens"], [*TOKEN_ARGS, "--batch-size", str(b), "--out-dir", str(out["tokens-2"])],
            tmp / "tokens-2.log"))
        # the single-process runs, all in one process (tests/runner.py): main() of the SAME projects
        facts["killed"].wait(timeout=2 * RUN_TIMEOUT)
        jobs = [
            {"project": projects["accum"], "args": [*ACCUM_ARGS, "--batch-size", str(2 * b), "--out-dir", str(out["accum-1"])]},
            # batch b in one process: how far apart runs end that do NOT see the same samples per update
            {"project": projects["accum"], "args": [*ACCUM_ARGS, "--batch-size", str(b), "--out-dir", str(out["accum-1-small"])]},
            {"project": projects["tokens"], "args": [*TOKEN_ARGS, "--batch-size", str(2 * b), "--out-dir", str(out["tokens-1"])]},
        ]
        if (tmp / "killed-last.pt").exists():  # resuming a 2-process checkpoint in 1 process
            jobs.append({"project": projects["accum"], "args": [
                *ACCUM_ARGS, *DROPOUT, "--batch-size", str(b), "--out-dir", str(out["refused"]),
                "--resume", str(tmp / "killed-last.pt")]})
        single = dict(zip(["accum-1", "accum-1-small", "tokens-1", "refused"], run_jobs(jobs, tmp, timeout=2 * RUN_TIMEOUT)))
        # a run that fails fails the tests that read its outputs, not the fixture
        codes = {"reference": reference.wait(), "tokens-2": tokens.wait()}
        logs = {"reference": reference.output(), "tokens-2": tokens.output()}
        logs["node_codes"] = [n.wait() for n in nodes]
        logs["nodes"] = [n.output() for n in nodes]
        thread.join(timeout=3 * RUN_TIMEOUT)
    finally:
        for run in [*started, *facts["runs"]]:
            if run.proc.poll() is None:
                run.kill()
    return {"tmp": tmp, "projects": projects, "out": out, "hook_dir": hook_dir, "logs": logs, "codes": codes,
            "single": single, "chain": facts}


def finished(runs, name: str) -> Path:
    """The --out-dir of a run that must have finished (exit 0)."""
    if name in runs["single"]:
        result = runs["single"][name]
        assert result["ok"], f"{name}: {result['error']}\n{result['stdout']}"
    else:
        assert runs["codes"][name] == 0, f"{name} exited {runs['codes'][name]}:\n{runs['logs'][name][-4000:]}"
    return runs["out"][name]


def two_node_out(runs) -> Path:
    logs = runs["logs"]
    assert logs["node_codes"] == [0, 0], "\n\n".join(log[-3000:] for log in logs["nodes"])
    written = [runs["out"][f"node{r}"] for r in (0, 1) if runs["out"][f"node{r}"].exists()]
    assert len(written) == 1, written  # the other node's --out-dir was never even created
    return written[0]


def test_two_nodes_train_and_finish(runs):
    """Two torchrun agents as two nodes (--nnodes 2, node ranks 0 and 1, c10d rendezvous on
    127.0.0.1, one process each): both finish; final.pt exists once, on the global rank 0's side."""
    out_dir = two_node_out(runs)
    assert (out_dir / "final.pt").is_file() and (out_dir / "best.pt").is_file()
    assert sum(f"done: {ACCUM_UPDATES} updates" in log for log in runs["logs"]["nodes"]) == 2


def test_two_ranks_with_grad_accum_equal_one_process_with_twice_the_batch(runs):
    """The two-node run: 2 ranks x batch 4 x 2 micro-batches == 1 process x batch 8 x 2 micro-batches,
    9 updates over 3 epochs with a shorter last window each epoch (text task: no BatchNorm, dropout 0)."""
    two, one = final_model(two_node_out(runs)), final_model(finished(runs, "accum-1"))
    other = final_model(finished(runs, "accum-1-small"))
    assert max_relative_difference(two, one) <= 1e-5
    # the comparison can tell runs apart: a run on other samples per update ends far away
    assert max_relative_difference(other, one) > 1e-3


def test_validation_of_odd_sized_set_equals_single_process(runs):
    """37 validation samples: shards of 19 and 18. Summed and all-reduced, the metrics equal one
    process evaluating all 37 (a padded duplicate, or rank 0's shard alone, would not)."""
    two, one = val_rows(two_node_out(runs)), val_rows(finished(runs, "accum-1"))
    assert [r["epoch"] for r in two] == [r["epoch"] for r in one] == ["1", "2", "3"]
    for a, b in zip(two, one):
        for name in ("val_loss", "val_acc"):
            assert float(a[name]) == pytest.approx(float(b[name]), rel=1e-6, abs=0), (name, a, b)


def test_only_rank_zero_writes_logs_and_files(runs):
    """One header and each update once in metrics.csv (a second writer would duplicate rows), on
    one node and across two nodes."""
    for out_dir in (finished(runs, "reference"), two_node_out(runs)):
        lines, rows = read_metrics(out_dir)
        assert sum(line.startswith("step,") for line in lines) == 1
        assert [int(r["step"]) for r in rows if r["train_loss"]] == list(range(1, ACCUM_UPDATES + 1))
        assert [r["epoch"] for r in rows if r["val_loss"]] == ["1", "2", "3"]
    # both ranks finished the same number of updates
    assert runs["logs"]["reference"].count(f"done: {ACCUM_UPDATES} updates") == 2


def test_token_task_two_ranks_equal_one_process_global_token_count(runs):
    """Token classification, ddp without grad-accum, sentences of 3 to ~40 words: the ranks'
    batches hold different numbers of real tokens, and only division by the all-reduced (global)
    count gives the 1-process gradient. 2 ranks x batch 4 == 1 process x batch 8."""
    two_dir, one_dir = finished(runs, "tokens-2"), finished(runs, "tokens-1")
    assert max_relative_difference(final_model(two_dir), final_model(one_dir)) <= 1e-5
    two, one = val_rows(two_dir), val_rows(one_dir)
    assert len(two) == len(one) == 2
    for a, b in zip(two, one):
        for name in ("val_loss", "val_acc", "val_f1"):
            assert float(a[name]) == pytest.approx(float(b[name]), rel=1e-6, abs=1e-12), (name, a, b)


def test_rank_order_follows_distributed_sampler_and_changes_every_epoch(runs):
    """Catches a missing `train_sampler.set_epoch(epoch)`: each rank's fetched indices, epoch by
    epoch, are randperm(n, seed + epoch)[rank::2], so epoch 2 and 3 differ from epoch 1. Together,
    rank 0's and rank 1's k-th micro-batches are exactly the 1-process k-th batch of 2b."""
    finished(runs, "reference")
    per_epoch = TRAIN // 2
    fetched = {r: json.loads((runs["hook_dir"] / f"rank{r}.json").read_text())["fetched"] for r in (0, 1)}
    for rank in (0, 1):
        assert len(fetched[rank]) == 3 * per_epoch
        for epoch in range(3):
            got = fetched[rank][epoch * per_epoch:(epoch + 1) * per_epoch]
            assert got == expected_rank_order(TRAIN, epoch, rank), f"rank {rank}, epoch {epoch + 1}"
    assert fetched[0][:per_epoch] != fetched[0][per_epoch:2 * per_epoch]
    b = PER_RANK_BATCH
    for k in range(per_epoch // b):
        together = set(fetched[0][k * b:(k + 1) * b]) | set(fetched[1][k * b:(k + 1) * b])
        full_order = expected_rank_order(TRAIN, 0, 0, world_size=1)
        assert together == set(full_order[2 * b * k:2 * b * (k + 1)])


def test_gradients_are_all_reduced_once_per_update_not_per_micro_batch(runs):
    """Catches a missing `model.no_sync()`: without it DDP all-reduces after every micro-batch
    (15 passes per rank here) instead of once per optimizer update (9). The weights cannot show
    this (averaging twice gives the same sums), the all-reduce count does."""
    finished(runs, "reference")
    for rank in (0, 1):
        record = json.loads((runs["hook_dir"] / f"rank{rank}.json").read_text())
        assert record["allreduce_passes"] == ACCUM_UPDATES, f"rank {rank}"
        assert len(record["fetched"]) == ACCUM_MICRO_BATCHES * PER_RANK_BATCH


def test_one_all_reduce_per_update_carries_the_count_and_the_stop_flags(runs):
    """Issue 22: the window's sample count and the stop flag (a stop signal: this project has
    resume) travel in ONE all-reduce per update, not one each. Between two optimizer steps that do
    not straddle a validation (epochs end at updates 3 and 6), train.py's own all-reduces are
    exactly over_ranks() (the count and the flag) and read_loss() (the mean loss over ranks, at
    log steps: --log-every 1 makes every update one, where the flag is read too). The loop before
    had an all-reduce for the flag of its own."""
    finished(runs, "reference")
    for rank in (0, 1):
        between = json.loads((runs["hook_dir"] / f"rank{rank}.json").read_text())["allreduces_between_steps"]
        assert len(between) == ACCUM_UPDATES, between
        within_epochs = [sorted(calls) for n, calls in enumerate(between[:-1], 1) if n % 3]
        expected = ["over_ranks", "read_loss"]
        assert within_epochs == [expected] * 6, f"rank {rank}: all-reduces between steps {between}"


# --- kill -9, SIGTERM and resume ----------------------------------------------------------------


def chain_facts(runs) -> dict:
    facts = runs["chain"]
    assert facts["error"] is None, facts["error"]
    return facts


def test_kill9_resume_sigterm_resume_ends_bitwise_equal_to_uninterrupted(runs):
    """kill -9 of torchrun and both workers inside update 6, with last.pt at step 4; resume (which
    redoes update 5), SIGTERM, resume again: the final weights equal the uninterrupted 2-rank run's
    bit for bit. Dropout is on, so this also needs each rank's own random generator restored."""
    facts = chain_facts(runs)
    assert facts["killed_last_step"] == 4
    assert max(facts["killed_logged_steps"]) == 5  # update 5 happened after last.pt, and is lost
    assert "step 4, epoch 2, batch 2" in facts["sigterm_log"]  # the first resume
    assert "step 7, epoch 3, batch 2" in facts["final_log"]  # the second resume
    assert bitwise_equal(final_model(facts["out_dir"]), final_model(finished(runs, "reference")))


def test_sigterm_to_one_rank_stops_all_ranks_at_the_same_update(runs):
    """SIGTERM reached rank 1 only, inside update 7. The all-reduced stop flag stops rank 0 after the
    same update: both ranks report update 7, rank 0 saved last.pt at step 7, the workers exit 75
    (torchrun reports that as a failure), and the next resume continues from step 7 (test above).
    torchrun sends SIGTERM to the other workers as soon as one exits: a rank that already printed
    its message (after the save) may be in interpreter teardown, where Python has restored the
    default handler, and end with -15 instead; the first to exit always reports 75."""
    facts = chain_facts(runs)
    log = facts["sigterm_log"]
    assert facts["sigterm_code"] != 0, log[-3000:]
    assert log.count("step 7: stop signal received") == 2, log[-4000:]
    exit_codes = [line.split(":", 1)[1].split()[0] for line in log.splitlines()
                  if line.strip().startswith("exitcode")]
    assert "75" in exit_codes and set(exit_codes) <= {"75", "-15"}, log[-3000:]
    assert facts["sigterm_last_step"] == 7


def test_resume_with_another_world_size_is_refused(runs):
    """A last.pt written by 2 processes, resumed by `python train.py` (1 process) with half the global
    batch: refused, naming the numbers and the flag that keeps the global batch."""
    refused = runs["single"].get("refused")
    assert refused is not None, f"the killed run left no last.pt: {runs['chain']['error']}"
    assert refused["exit_code"] == 1, refused
    # another number of ranks may resume only with the same global batch (tests/test_faults.py)
    assert "written with 2 processes x --batch-size" in refused["error"], refused["error"]
    assert "this run has 1 process x --batch-size" in refused["error"], refused["error"]
    assert "keep the global batch (--grad-accum-steps " in refused["error"], refused["error"]
    assert not (runs["out"]["refused"] / "last.pt").exists()
