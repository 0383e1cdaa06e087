"""The Lightning side of the benchmarks: the generated project's model and data under `L.Trainer`.

Used two ways:
- in-process by train_throughput.py (`fit(...)`), on the same in-memory tensors as every other
  variant;
- as a script by startup.py, the Lightning counterpart of `python train.py`:

      python benchmarks/lightning_train.py --project PROJECT_DIR [--epochs 1 --batch-size 64 ...]

  It imports the generated project's own `data.py` and `model.py`, so model and data are the
  generated script's, built from the same defaults (built-in synthetic images, small CNN).

Settings are matched to the generated train.py: AdamW with the same lr and weight decay, the same
linear-warmup + cosine schedule stepped per optimizer update, cross-entropy, the training loss
logged every update (`self.log`, the Lightning way; the generated script keeps it every update
and writes a row every --log-every updates), validation once per epoch with no sanity check
(the generated script has none), no model summary, no progress bar (the generated script's tqdm
bar is off when stdout is not a terminal, as in every benchmark), fp32.
`like="minimal"`: CSV logger, Lightning's default end-of-epoch checkpoint (the generated script
writes best.pt after validation). `like="all"`: also a TensorBoard logger, a learning-rate
monitor, a checkpoint every `checkpoint_every` updates, a best-val checkpoint, EarlyStopping, and
a callback printing throughput every 50 updates: what the generated `all` project does.

Requires `pip install lightning` (or `pip install -e '.[bench]'`); it must not replace torch.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def quiet_lightning() -> None:
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    warnings.filterwarnings("ignore", ".*litlogger.*")
    warnings.filterwarnings("ignore", ".*tensorboardX.*")
    warnings.filterwarnings("ignore", ".*Checkpoint directory.*exists and is not empty.*")


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """The generated train.py's schedule: linear warmup, then cosine decay to zero."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_module(model, *, lr: float, weight_decay: float, warmup_steps: int, total_steps: int):
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, inputs):
            return self.model(inputs)

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            loss = F.cross_entropy(self.model(inputs), targets)
            self.log("train_loss", loss, on_step=True, on_epoch=False)
            return loss

        def validation_step(self, batch, batch_idx):
            inputs, targets = batch
            logits = self.model(inputs)
            self.log("val_loss", F.cross_entropy(logits, targets), on_epoch=True)
            self.log("val_acc", (logits.argmax(-1) == targets).float().mean(), on_epoch=True)

        def configure_optimizers(self):
            optimizer = torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=weight_decay)
            scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda s: lr_factor(s, warmup_steps, total_steps)
            )
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return Classifier()


def make_trainer(
    out_dir: Path,
    *,
    like: str = "minimal",
    epochs: int = 1,
    log_every: int = 10,
    grad_accum: int = 1,
    clip: float = 0.0,
    checkpoint_every: int = 100,
    patience: int = 3,
):
    import lightning as L
    from lightning.pytorch import callbacks as lcb
    from lightning.pytorch import loggers

    quiet_lightning()
    out_dir = Path(out_dir)
    logs = [loggers.CSVLogger(out_dir, name="csv")]
    callbacks = []
    if like == "all":
        logs.append(loggers.TensorBoardLogger(out_dir, name="tb"))

        class PrintThroughput(L.Callback):  # the generated callbacks.ThroughputMonitor
            def __init__(self, every: int = 50):
                self.every, self.last = every, None

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                step = trainer.global_step
                if step and step % self.every == 0 and self.last != step:
                    now = time.perf_counter()
                    if self.last is not None:
                        print(f"step {step}: {self.every / (now - self.t):.1f} updates/s")
                    self.last, self.t = step, now

        callbacks += [
            lcb.ModelCheckpoint(dirpath=out_dir, every_n_train_steps=checkpoint_every),
            lcb.ModelCheckpoint(dirpath=out_dir, filename="best", monitor="val_loss"),
            lcb.EarlyStopping(monitor="val_loss", patience=patience, mode="min"),
            lcb.LearningRateMonitor(logging_interval="step"),
            PrintThroughput(),
        ]
    elif like != "minimal":
        raise ValueError(f"like must be minimal or all, got {like!r}")
    else:
        callbacks.append(lcb.ModelCheckpoint(dirpath=out_dir))
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        precision="32-true",
        logger=logs,
        callbacks=callbacks,
        enable_checkpointing=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=log_every,
        accumulate_grad_batches=grad_accum,
        gradient_clip_val=clip or None,
        default_root_dir=out_dir,
    )


def fit(
    model,
    train_set,
    val_set,
    out_dir: Path,
    *,
    batch_size: int,
    like: str = "minimal",
    epochs: int = 1,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    warmup_steps: int = 10,
    log_every: int = 10,
    grad_accum: int = 1,
    clip: float = 0.0,
    seed: int = 0,
    num_workers: int = 0,
    checkpoint_every: int = 100,
) -> None:
    """Train `model` with Lightning; the data loaders are built like the generated script's."""
    batches = math.ceil(len(train_set) / batch_size)
    total_steps = math.ceil(batches / grad_accum) * epochs
    module = make_module(
        model, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps, total_steps=total_steps
    )
    train_loader = DataLoader(
        train_set,
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        num_workers=num_workers,
    )
    val_loader = DataLoader(val_set, batch_size=batch_size, num_workers=num_workers)
    trainer = make_trainer(
        out_dir, like=like, epochs=epochs, log_every=log_every, grad_accum=grad_accum, clip=clip,
        checkpoint_every=checkpoint_every,
    )
    trainer.fit(module, train_loader, val_loader)


# --- script: the Lightning counterpart of `python train.py` (start-up benchmark) ---------------


def project_config(args) -> SimpleNamespace:
    """The fields the generated data.py/model.py read, with the generated Config's defaults."""
    return SimpleNamespace(
        data_dir="",
        synthetic_train_size=args.synthetic_train_size,
        synthetic_val_size=args.synthetic_val_size,
        image_size=args.image_size,
        arch="small-cnn",
        num_workers=0,
        seed=args.seed,
        batch_size=args.batch_size,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", required=True, help="a generated image-classification project")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--synthetic-train-size", type=int, default=2000)
    parser.add_argument("--synthetic-val-size", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--like", choices=["minimal", "all"], default="minimal")
    parser.add_argument("--out-dir", default="runs/lightning")
    args = parser.parse_args(argv)

    project = str(Path(args.project).resolve())
    sys.path.insert(0, project)
    from data import build_datasets  # the generated project's own modules
    from model import build_model

    torch.manual_seed(args.seed)
    cfg = project_config(args)
    train_set, val_set, data_info = build_datasets(cfg)
    model = build_model(cfg, data_info)
    fit(
        model,
        train_set,
        val_set,
        Path(args.out_dir),
        batch_size=args.batch_size,
        like=args.like,
        epochs=args.epochs,
        log_every=args.log_every,
        seed=args.seed,
        clip=1.0,  # the generated default --max-grad-norm
    )
    print("done")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
