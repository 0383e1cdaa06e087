"""[pretrained] The model: a pretrained timm backbone with a new classification head
for our classes."""

import json
from pathlib import Path
from types import SimpleNamespace

import timm
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from timm.models import save_for_hf
from torch import nn


def build_model(cfg, data_info: dict) -> nn.Module:
    """[pretrained] timm.create_model(pretrained=True) downloads the backbone's weights
    (or reads --weights: safetensors or a torch state dict) and replaces its classifier
    by a new one for our classes; everything else keeps its pretrained values."""
    overlay = {"file": str(Path(cfg.weights).resolve())} if cfg.weights else None
    try:
        model = timm.create_model(
            cfg.model,
            pretrained=True,
            num_classes=len(data_info["classes"]),
            pretrained_cfg_overlay=overlay,
        )
        if cfg.weights:
            check_weights_file(cfg.weights, model)
    except (OSError, RuntimeError, ValueError) as exc:
        reason = (
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        source = f"--weights {cfg.weights}" if cfg.weights else "the hub (no network?)"
        raise SystemExit(
            f"error: --model {cfg.model}: cannot load its weights from {source} "
            f"({reason}); pass a weights file made for this model with --weights PATH"
        ) from None
    return model


def check_weights_file(path: str, model: nn.Module) -> None:
    """[pretrained] timm loads a weights file leniently when it replaces the head (keys
    that do not match are skipped): make sure the file held every backbone tensor."""
    if path.endswith(".safetensors"):
        state = load_file(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    head = model.pretrained_cfg["classifier"] + "."
    missing = [
        k for k in model.state_dict() if k not in state and not k.startswith(head)
    ]
    if missing:
        raise ValueError(f"it lacks {len(missing)} backbone tensors, e.g. {missing[0]}")


def split_parameters(model: nn.Module) -> tuple[list, list]:
    """[pretrained] (backbone parameters, new head parameters)."""
    head = {id(p) for p in model.get_classifier().parameters()}
    backbone = [p for p in model.parameters() if id(p) not in head]
    return backbone, list(model.get_classifier().parameters())


def export(model: nn.Module, folder: Path, data_info: dict) -> None:
    """[pretrained] model.safetensors + config.json: timm.create_model(
    "local-dir:FOLDER", pretrained=True) loads it without this code."""
    save_for_hf(
        model,
        folder,
        model_config={"label_names": data_info["classes"]},
        safe_serialization=True,
    )


# --- the loss and the metrics: what train.py's loop calls ----------------------------


def build_loss_args(cfg, data_info: dict, device) -> dict:
    """summed_loss's keyword arguments in training: the class weights and the label
    smoothing of --class-weights and --label-smoothing."""
    weight = class_weight(data_info, device)
    return {"weight": weight, "label_smoothing": cfg.label_smoothing}


def class_weight(data_info: dict, device) -> torch.Tensor | None:
    """--class-weights balanced: a weight per class, counted by data.py on the training
    labels and kept in data_info (in every checkpoint); None: every class weighs 1."""
    weights = data_info.get("class_weights")
    return None if weights is None else torch.tensor(weights, device=device)


def compute_loss(model, batch, loss_args: dict):
    """The loss summed over a batch, and what it is normalised by (loss_count). The loop
    divides, by this count or by a whole accumulation window's; amp, grad-accum, ddp and
    fsdp wrap this call and never change it: your own loss (another head, focal loss)
    goes here, or in summed_loss. loss_args: what build_loss_args returned."""
    inputs, targets = batch
    loss = summed_loss(model(inputs), targets, **loss_args)
    return loss, loss_count(batch, loss_args)


def summed_loss(logits, targets, weight=None, label_smoothing=0.0) -> torch.Tensor:
    """Cross-entropy summed over the batch, each sample's term times its class's weight
    (weight: one per class, or None); label smoothing in training only, so validation
    losses compare across settings (as timm validates)."""
    return F.cross_entropy(
        logits.float(),
        targets,
        weight=weight,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


def loss_count(batch, loss_args: dict):
    """What a batch's loss is divided by: its samples, or with class weights the sum of
    their classes' weights (cross_entropy's own weighted mean), so an accumulation
    window or all ranks give the weighted mean over all their samples. Read from the
    batch alone, with no forward pass: a window knows its size before any backward."""
    _, targets = batch
    weight = loss_args.get("weight")
    return len(targets) if weight is None else weight[targets].sum()


def validation_sums(model, batch, data_info: dict) -> torch.Tensor:
    """A validation batch's loss (weighted as in training, no label smoothing), the sum
    of its weights, correct predictions and samples. train.py's evaluate() adds them up
    over the whole set (and every rank) and hands them to validation_metrics; data_info
    is what data.py's build_datasets returned."""
    inputs, targets = batch
    logits = model(inputs)
    loss_args = {"weight": class_weight(data_info, targets.device)}
    loss = summed_loss(logits, targets, **loss_args)
    weights = torch.as_tensor(loss_count(batch, loss_args), device=targets.device)
    correct = (logits.argmax(-1) == targets).sum()
    count = torch.tensor(len(targets), device=targets.device)
    return torch.stack([loss, weights, correct, count]).double()


def validation_metrics(sums: torch.Tensor) -> dict:
    """What train.py logs (and selects best.pt by), from validation_sums' totals."""
    loss, weights, correct, count = sums.tolist()
    return {"val_loss": loss / weights, "val_acc": correct / count}


def load_run_config(folder: Path) -> SimpleNamespace:
    """[pretrained] The config of the run whose <out-dir>/model/ `folder` is: the
    config.json train.py wrote beside it."""
    path = folder.parent / "config.json"
    try:
        return SimpleNamespace(**json.loads(path.read_text()))
    except (OSError, ValueError):
        raise SystemExit(
            f"error: {folder}: no readable {path} beside it; pass the model folder of"
            " a run (<out-dir>/model), or its best.pt"
        ) from None


def load_exported(folder: Path, device: torch.device):
    """[pretrained] (model in eval mode on `device`, config, data info) of the folder
    <out-dir>/model/ that train.py exported, loaded with timm alone; the class names
    are in its config.json, the run's config beside the folder."""
    cfg = load_run_config(folder)
    try:
        model = timm.create_model(f"local-dir:{folder}", pretrained=True)
        data = {"classes": list(model.pretrained_cfg["label_names"])}
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0][:120]
        raise SystemExit(
            f"error: {folder}: not a model folder written by train.py ({reason})"
        ) from None
    return model.to(device).eval(), cfg, data


def load_trained(path, device: torch.device):
    """(model in eval mode on `device`, config, data info) of a best.pt or final.pt
    written by train.py. The model is rebuilt from the checkpoint's own config, so no
    flag is repeated. Anything else (a damaged file, another task's checkpoint) stops
    with one line."""
    if Path(path).is_dir():  # [pretrained] <out-dir>/model/, the exported model
        return load_exported(Path(path), device)
    try:
        # weights_only: tensors and plain data only, never arbitrary pickled objects
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SystemExit(f"error: {path}: no such file; pass a run's best.pt") from None
    except Exception as exc:  # torch.load raises many types for a damaged file
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        reason = reason.split(". ")[0][:120]  # the first sentence
        raise SystemExit(
            f"error: {path}: not a readable checkpoint ({reason});"
            " pass a run's best.pt or final.pt"
        ) from None
    # what build_model needs of the data info; keys of your own may come with them
    needed = {"classes"}
    fields = checkpoint.keys() if isinstance(checkpoint, dict) else set()
    data = checkpoint.get("data") if {"model", "config"} <= fields else None
    config = checkpoint.get("config") if data is not None else None
    # the task train.py wrote it for (files of template versions before 27 name none)
    task = checkpoint.get("task") if data is not None else None
    if task not in (None, "image-classification"):
        raise SystemExit(
            f"error: {path}: a {task} checkpoint, not image-classification;"
            " pass a best.pt or final.pt written by this project's train.py"
        )
    if not (
        isinstance(data, dict) and needed <= data.keys() and isinstance(config, dict)
    ):
        raise SystemExit(
            f"error: {path}: not a image-classification checkpoint;"
            " pass a best.pt or final.pt written by this project's train.py"
        )
    cfg = SimpleNamespace(**config)
    try:
        model = build_model(cfg, data)
        model.load_state_dict(checkpoint["model"])
    except (AttributeError, TypeError, RuntimeError) as exc:
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0][:120]
        raise SystemExit(
            f"error: {path}: its weights do not fit this project's model ({reason})"
        ) from None
    return model.to(device).eval(), cfg, data


def best_device(name: str = "auto") -> torch.device:
    """auto: a CUDA GPU, else Apple's MPS, else the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    return torch.device(name)
