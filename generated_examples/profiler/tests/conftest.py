"""Shared helpers for this project's tests, which run YOUR train.py, model.py
and data.py.

Each test calls `train.main([...])` in this process with tiny settings and checks one
guarantee of the features this project was generated with; README.md ("What the tests
guarantee") lists them. An edit that breaks a guarantee fails its test at once. Run them
from the project folder: `pytest`, or `pytest -x -q -k NAME` for one.

`pytest --data-dir=DATA` runs them on a sample of YOUR data instead of the built-in
data: DATA is a folder as `python train.py --data-dir DATA` reads it (the `=` matters:
pytest takes a bare folder for a test path before it has read this file).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

import train

# Tiny built-in data on the CPU: each run takes a second or two. A later flag overrides
# an earlier one, so a test adds its own settings after these.
TINY = ["--device", "cpu", "--batch-size", "8", "--log-every", "1"]
TINY += ["--synthetic-train-size", "64", "--synthetic-val-size", "16"]
TINY += ["--image-size", "16"]  # small images: the same code paths, four times faster

# Tiny models on tiny batches run as fast on one thread, and a busy machine slows them
# less.
torch.set_num_threads(1)


# the most samples a test asks of the built-in data (--synthetic-train-size 72, ...)
MIN_TRAIN, MIN_VAL = 72, 16
YOUR_DATA = []  # with `pytest --data-dir=DATA`, what the header says of DATA


def pytest_addoption(parser):
    parser.addoption(
        "--data-dir",
        default="",
        metavar="DATA",
        help="run the tests on a sample of your data (what train.py --data-dir reads)",
    )


def pytest_configure(config):
    """`pytest --data-dir=DATA`: every run reads DATA (see sample_your_data), which is
    read once here first, so that unreadable data stops the tests with one line."""
    data_dir = config.getoption("--data-dir")
    if not data_dir:
        return
    if not Path(data_dir).is_dir():
        raise pytest.UsageError(f"--data-dir {data_dir}: not a folder")
    TINY.extend(["--data-dir", str(Path(data_dir).resolve())])
    cfg = train.parse_config(TINY)
    try:
        train_set, val_set, _ = train.build_datasets(cfg)
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"--data-dir {data_dir}: {exc}") from None
    if len(train_set) < MIN_TRAIN or len(val_set) < MIN_VAL:
        raise pytest.UsageError(
            f"--data-dir {data_dir}: {len(train_set)} training and {len(val_set)} "
            f"validation samples; the tests need at least {MIN_TRAIN} and {MIN_VAL}"
        )
    YOUR_DATA.append(
        f"--data-dir {data_dir}: {len(train_set)} training and {len(val_set)} "
        "validation samples; each run reads a fixed sample of them"
    )
    sample_your_data(setattr)  # for the whole session, module fixtures' runs too


def pytest_report_header(config):
    return YOUR_DATA


def sample_your_data(setattr) -> None:
    """train.main() reads a sample of the --data-dir it is given: as many samples as
    the built-in data would have (--synthetic-train-size, --synthetic-val-size), the
    same ones in every run, so that each test keeps its sizes. `setattr` sets
    train.build_datasets (here and in a torchrun worker: the builtin)."""
    build_datasets = train.build_datasets

    def build_sampled_datasets(cfg, *args):
        train_set, val_set, data_info = build_datasets(cfg, *args)
        if cfg.data_dir:
            train_set = sample(train_set, cfg.synthetic_train_size)
            val_set = sample(val_set, cfg.synthetic_val_size)
        return train_set, val_set, data_info

    setattr(train, "build_datasets", build_sampled_datasets)


def sample(dataset, size: int):
    """`size` samples of `dataset` drawn with a fixed seed, kept in their order."""
    if size >= len(dataset):
        return dataset
    keep = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.Subset(dataset, sorted(keep[:size].tolist()))


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
