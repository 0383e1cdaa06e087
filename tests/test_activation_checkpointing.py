"""--activation-checkpointing (issue 29, item 7): every project has it, single-process and under
ddp (fsdp's own tests run it sharded). The generated train.py is run twice per model, with the
flag and without, from the same seed and data: the final weights AND buffers are bitwise equal
(dropout on: the recompute draws the same numbers; BatchNorm's running statistics see each batch
once, not twice), and with the flag the blocks really are recomputed (the calls of train.py's
`recompute`, torch.utils.checkpoint.checkpoint, are counted, and each call's function runs
twice: once forward, once in backward)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import tiny_models
from conftest import render_project
from scaffold.examples import ROOT

pytestmark = pytest.mark.slow

TINY = ["--synthetic-train-size", "32", "--synthetic-val-size", "8", "--batch-size", "8", "--epochs", "1",
        "--max-steps", "3", "--device", "cpu", "--log-every", "1"]

# One subprocess runs every job: train.main(args) with and without the flag, then compares final.pt.
PROBE = r'''
import functools, json, os, sys
import torch

jobs, results_path = json.loads(sys.argv[1]), sys.argv[2]
results = []
for job in jobs:
    runs = {}
    for flag in ([], ["--activation-checkpointing"]):
        for name in ("train", "data", "model", "callbacks"):
            sys.modules.pop(name, None)
        sys.path.insert(0, job["project"])
        os.chdir(job["project"])
        import train

        calls = {"checkpoint": 0, "function": 0}
        real = train.recompute

        def counted(function, *args, **kwargs):
            calls["checkpoint"] += 1

            def run(*a, **k):
                calls["function"] += 1
                return function(*a, **k)

            return real(run, *args, **kwargs)

        train.recompute = counted
        out = os.path.join(job["out"], "with" if flag else "without")
        train.main([*job["args"], *flag, "--out-dir", out])
        sys.path.remove(job["project"])
        state = torch.load(os.path.join(out, "final.pt"), weights_only=True)["model"]
        runs[bool(flag)] = (state, dict(calls))
    (plain, plain_calls), (checkpointed, calls) = runs[False], runs[True]
    differ = [key for key in plain if not torch.equal(plain[key], checkpointed[key])]
    buffers = [key for key in plain if "running_" in key or "num_batches" in key]
    results.append({"name": job["name"], "differ": differ, "keys": len(plain), "buffers": len(buffers),
                    "plain_calls": plain_calls, "calls": calls})
with open(results_path, "w") as f:
    json.dump(results, f)
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("activation-checkpointing")
    bert = tiny_models.bert(root / "bert")
    timm_file = tiny_models.timm_weights(root / "test_resnet.safetensors")
    projects = {
        "image": render_project(root / "image", "image-classification"),
        "text": render_project(root / "text", "text-classification"),
        "tokens": render_project(root / "tokens", "token-classification"),
        "text-pretrained": render_project(root / "text-pretrained", "text-classification", ["pretrained"]),
        "image-pretrained": render_project(root / "image-pretrained", "image-classification", ["pretrained"]),
    }
    jobs = [
        ("small-cnn", "image", []),  # BatchNorm inside the one recomputed conv stack
        ("resnet18", "image", ["--arch", "resnet18"]),  # torchvision: BasicBlocks with BatchNorm
        ("text-transformer", "text", ["--encoder", "transformer", "--dropout", "0.2"]),
        ("token-transformer", "tokens", ["--dropout", "0.2"]),
        ("bert", "text-pretrained", ["--model", str(bert)]),  # its dropout is on (0.1)
        ("timm", "image-pretrained", ["--model", "test_resnet", "--weights", str(timm_file)]),
    ]
    payload = [{"name": name, "project": str(projects[kind]), "args": [*TINY, *args], "out": str(root / name)}
               for name, kind, args in jobs]
    results_path = root / "results.json"
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(payload), str(results_path)],
                          capture_output=True, text=True, timeout=900)
    assert results_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r["name"]: r for r in json.loads(results_path.read_text())}


@pytest.mark.parametrize("name", ["small-cnn", "resnet18", "text-transformer", "token-transformer", "bert",
                                  "timm"])
def test_the_same_weights_and_buffers_with_and_without_recompute(results, name):
    result = results[name]
    assert result["differ"] == [], f"{name}: {len(result['differ'])} of {result['keys']} tensors differ"
    assert result["plain_calls"] == {"checkpoint": 0, "function": 0}
    # with the flag every block runs through torch.utils.checkpoint, and runs twice in training
    assert result["calls"]["checkpoint"] > 0
    assert result["calls"]["function"] > result["calls"]["checkpoint"]
    if name in ("small-cnn", "resnet18", "timm"):
        assert result["buffers"] > 0  # BatchNorm's statistics were compared too


def test_ddp_two_ranks_with_recompute_end_with_the_weights_of_ddp_without(tmp_path):
    """A real torchrun (2 gloo ranks) of the ddp example, with BatchNorm and DDP's gradient
    all-reduce around recomputed blocks: the same final.pt as without the flag."""
    import torch
    from test_ddp import torchrun, wait_ok

    project = shutil.copytree(ROOT / "ddp", tmp_path / "project")
    finals = {}
    for flag in ([], ["--activation-checkpointing"]):
        out = tmp_path / ("with" if flag else "without")
        wait_ok(torchrun(project, [*TINY, *flag, "--out-dir", str(out)], tmp_path / f"{out.name}.log"), "2 ranks")
        finals[bool(flag)] = torch.load(out / "final.pt", weights_only=True)["model"]
    differ = [key for key in finals[False] if not torch.equal(finals[False][key], finals[True][key])]
    assert differ == []
    assert any("running_mean" in key for key in finals[False])
