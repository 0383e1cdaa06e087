"""Shared helpers for this project's tests, which run YOUR train.py, model.py
and data.py.

Each test calls `train.main([...])` in this process with tiny settings and checks one
guarantee of the features this project was generated with; README.md ("What the tests
guarantee") lists them. An edit that breaks a guarantee fails its test at once. Run them
from the project folder: `pytest`, or `pytest -x -q -k NAME` for one.
"""

from __future__ import annotations

import csv
import tempfile  # [pretrained]
from pathlib import Path

import torch

import train

# Tiny built-in data on the CPU: each run takes a second or two. A later flag overrides
# an earlier one, so a test adds its own settings after these.
TINY = ["--device", "cpu", "--batch-size", "8", "--log-every", "1"]
TINY += ["--synthetic-train-size", "64", "--synthetic-val-size", "16"]
TINY += ["--image-size", "16"]  # small images: the same code paths, four times faster
# [pretrained] a tiny model built here stands in for a download (tests run offline)
PRETRAINED = Path(tempfile.mkdtemp(prefix="tiny-pretrained-"))
TINY += ["--model", "test_resnet", "--weights", str(PRETRAINED / "weights.safetensors")]

# Tiny models on tiny batches run as fast on one thread, and a busy machine slows them
# less.
torch.set_num_threads(1)


def save_tiny_pretrained(path: Path) -> None:
    """[pretrained] timm's test_resnet (370k parameters) with random weights, saved as
    a safetensors file: what --weights reads instead of a download."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=1000)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


save_tiny_pretrained(PRETRAINED / "weights.safetensors")  # [pretrained]


def run_main(out_dir: Path, *args) -> dict:
    """Your train.main() in this process: TINY settings, outputs in `out_dir`, then
    `args`. Returns what main returns: the final validation metrics."""
    return train.main([*TINY, "--out-dir", str(out_dir), *map(str, args)])


def load(out_dir: Path, name: str = "final.pt") -> dict:
    """A file written by train.py, loaded the safe way: tensors and plain data only."""
    return torch.load(Path(out_dir) / name, map_location="cpu", weights_only=True)


def read_metrics(out_dir: Path) -> tuple[list[dict], list[dict]]:
    """metrics.csv as (training rows, validation rows): numbers as floats, no empty
    cells."""
    with open(Path(out_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows = [{k: float(v) for k, v in row.items() if v != ""} for row in rows]
    return [r for r in rows if "train_loss" in r], [r for r in rows if "val_loss" in r]


def assert_bitwise_equal(a: dict, b: dict) -> None:
    """Two state dicts hold the same tensors, bit for bit."""
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    message = f"{len(different)} of {len(a)} tensors differ: {different[:3]}"
    assert not different, message
