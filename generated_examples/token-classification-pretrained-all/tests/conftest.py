"""Shared helpers for this project's tests, which run YOUR train.py, model.py
and data.py.

Each test calls `train.main([...])` in this process with tiny settings and checks one
guarantee of the features this project was generated with; README.md ("What the tests
guarantee") lists them. An edit that breaks a guarantee fails its test at once. Run them
from the project folder: `pytest`, or `pytest -x -q -k NAME` for one.

`pytest --data-dir=DATA` runs them on a sample of YOUR data instead of the built-in
data: DATA is a folder as `python train.py --data-dir DATA` reads it (the `=` matters:
pytest takes a bare folder for a test path before it has read this file).

[ddp] test_ddp.py also starts `torchrun`.
"""

from __future__ import annotations

import csv
import signal  # [resume]
import tempfile  # [pretrained]
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_pre_hook,
)  # [amp] [grad-accum] [resume] [ddp]

import data  # [pretrained]
import train

# [ddp] where test_ddp.py starts torchrun
PROJECT = Path(__file__).resolve().parent.parent

# Tiny built-in data on the CPU: each run takes a second or two. A later flag overrides
# an earlier one, so a test adds its own settings after these.
TINY = ["--device", "cpu", "--batch-size", "8", "--log-every", "1"]
TINY += ["--synthetic-train-size", "64", "--synthetic-val-size", "16"]
TINY += ["--no-compile"]  # [compile] eager runs, except in test_compile.py
# [pretrained] a tiny model built here stands in for a download (tests run offline)
PRETRAINED = Path(tempfile.mkdtemp(prefix="tiny-pretrained-"))
TINY += ["--model", str(PRETRAINED), "--lr", "1e-3"]
# [early-stopping] no run stops early, except in test_early_stopping.py
TINY += ["--patience", "1000"]

# Tiny models on tiny batches run as fast on one thread, and a busy machine slows them
# less.
torch.set_num_threads(1)


def save_tiny_pretrained(folder: Path) -> None:
    """[pretrained] A 2-layer BERT (width 32) with random weights and a WordPiece
    tokenizer of the built-in data's words, saved with save_pretrained: what --model
    reads instead of a download."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    corpus = [*map(" ".join, data.ENTITIES.values()), " ".join(data.FILLER)]
    tok.train_from_iterator(
        corpus, WordPieceTrainer(vocab_size=150, special_tokens=specials)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


save_tiny_pretrained(PRETRAINED)  # [pretrained]


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
        tokenizer = data.load_tokenizer(cfg)  # [pretrained]
        train_set, val_set, _ = data.build_datasets(cfg, tokenizer)  # [pretrained]
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


# [grad-accum] [ddp] two runs that batch the same samples differently
def relative_difference(a, b) -> float:
    """|a - b| / |b| over two tensors, or two state dicts taken as one vector. The same
    arithmetic in another order (a batch split in two, two processes) gives ~1e-7."""
    if isinstance(a, dict):
        a, b = [torch.cat([t.double().flatten() for t in x.values()]) for x in (a, b)]
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


# [amp] [grad-accum] [resume] [ddp] what each optimizer update applies
class UpdateRecorder:
    """Watches every optimizer.step() while active: the gradient the update applies (all
    parameters as one float32 vector, after clipping and unscaling) and its learning
    rate. `on_update(n)` is called just before the n-th update (1-based)."""

    def __init__(self, on_update=None):
        self.on_update = on_update
        self.grads, self.lrs = [], []

    def __enter__(self) -> "UpdateRecorder":
        self.handle = register_optimizer_step_pre_hook(self.record)
        return self

    def __exit__(self, *exc_info) -> None:
        self.handle.remove()

    def record(self, optimizer, args, kwargs) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
        self.grads.append(torch.cat([g.detach().float().flatten() for g in grads]))
        self.lrs.append(optimizer.param_groups[0]["lr"])
        if self.on_update is not None:
            self.on_update(len(self.lrs))


# [grad-accum] [ddp] comparable batchings
def batch_independent(patch, augment: bool = True) -> list[str]:
    """[pretrained] Make each sample's loss depend on that sample alone, so that two
    ways of batching the same samples can be compared exactly. `patch` is
    monkeypatch.setattr (or setattr); returns extra flags. Dropout draws its random
    mask for the shape of the whole batch: every dropout layer of the transformer gets
    p=0; layer norm works per token and padding is masked, so nothing else depends on
    the batch."""
    build_model = train.build_model

    def build_model_without_dropout(cfg, data_info):
        model = build_model(cfg, data_info)
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        return model

    patch(train, "build_model", build_model_without_dropout)
    return []


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """[resume] train.main() installs SIGTERM/SIGUSR1 handlers; put pytest's back after
    each test."""
    saved = [(s, signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGUSR1)]
    yield
    for signum, handler in saved:
        signal.signal(signum, handler)
