"""The model: a small CNN by default, or any torchvision classifier with random
weights."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head; trains on 32x32 images on a CPU in
    seconds."""

    def __init__(self, num_classes: int, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1),
            nn.BatchNorm2d(4 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).flatten(1))


def build_model(cfg, data_info: dict) -> nn.Module:
    num_classes = len(data_info["classes"])
    if cfg.arch == "small-cnn":
        return SmallCNN(num_classes)
    import torchvision

    if cfg.arch not in torchvision.models.list_models(torchvision.models):
        raise SystemExit(
            f"error: --arch {cfg.arch!r} is not small-cnn"
            " or a torchvision classifier (e.g. resnet18)"
        )
    # weights=None: random initialisation, nothing is downloaded
    return torchvision.models.get_model(cfg.arch, weights=None, num_classes=num_classes)


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


def load_trained(path, device: torch.device):
    """(model in eval mode on `device`, config, data info) of a best.pt or final.pt
    written by train.py. The model is rebuilt from the checkpoint's own config, so no
    flag is repeated. Anything else (a damaged file, another task's checkpoint) stops
    with one line."""
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
