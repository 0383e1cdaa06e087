"""[pretrained] The model: a pretrained Hugging Face transformer with a new
token classification head."""

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForTokenClassification

from data import IGNORE_INDEX, count_entities, load_tokenizer


class PretrainedTagger(nn.Module):
    """[pretrained] The transformers model, called with token ids alone: the attention
    mask is where the ids are not padding; the output is the logits of every sub-word.
    """

    def __init__(self, transformer: nn.Module, pad_id: int):
        super().__init__()
        self.transformer = transformer
        self.pad_id = pad_id

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        attention_mask = (token_ids != self.pad_id).long()
        return self.transformer(
            input_ids=token_ids, attention_mask=attention_mask
        ).logits


def build_model(cfg, data_info: dict) -> nn.Module:
    """[pretrained] The pretrained weights of --model, and a new head for our tags
    (a head already trained for exactly these labels is kept)."""
    labels = data_info["tags"]
    transformer = AutoModelForTokenClassification.from_pretrained(
        cfg.model,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        # a head of another size is replaced, not an error
        ignore_mismatched_sizes=True,
    )
    return PretrainedTagger(transformer, data_info["pad_id"])


def split_parameters(model: nn.Module) -> tuple[list, list]:
    """[pretrained] (backbone parameters, new head parameters): the backbone is the
    transformer's base model, the head everything else."""
    backbone = list(model.transformer.base_model.parameters())
    ids = {id(p) for p in backbone}
    return backbone, [p for p in model.parameters() if id(p) not in ids]


def export(model: nn.Module, folder: Path, tokenizer) -> None:
    """[pretrained] save_pretrained: AutoModelForTokenClassification
    .from_pretrained(FOLDER) and AutoTokenizer.from_pretrained(FOLDER) load it without
    this code."""
    model.transformer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# --- the loss and the metrics: what train.py's loop calls ----------------------------


def build_loss_args(cfg, data_info: dict, device) -> dict:
    """summed_loss's keyword arguments in training: the tag weights and the label
    smoothing of --class-weights and --label-smoothing."""
    weight = class_weight(data_info, device)
    return {"weight": weight, "label_smoothing": cfg.label_smoothing}


def class_weight(data_info: dict, device) -> torch.Tensor | None:
    """--class-weights balanced: a weight per tag, counted by data.py on the training
    tokens and kept in data_info (in every checkpoint); None: every tag weighs 1."""
    weights = data_info.get("class_weights")
    return None if weights is None else torch.tensor(weights, device=device)


def compute_loss(model, batch, loss_args: dict):
    """The loss summed over a batch, and what it is normalised by (loss_count). The loop
    divides, by this count or by a whole accumulation window's; amp, grad-accum, ddp and
    fsdp wrap this call and never change it: your own loss (a CRF, focal loss) goes
    here, or in summed_loss. loss_args: what build_loss_args returned."""
    inputs, targets = batch
    loss = summed_loss(model(inputs), targets, **loss_args)
    return loss, loss_count(batch, loss_args)


def summed_loss(logits, targets, weight=None, label_smoothing=0.0) -> torch.Tensor:
    """Cross-entropy summed over the real tokens (padding positions hold IGNORE_INDEX),
    each token's term times its tag's weight (weight: one per tag, or None); label
    smoothing in training only, so validation losses compare across settings."""
    # (batch, tags, length), as cross_entropy wants
    logits = logits.float().transpose(1, 2)
    return F.cross_entropy(
        logits,
        targets,
        weight=weight,
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
        reduction="sum",
    )


def loss_count(batch, loss_args: dict) -> torch.Tensor:
    """What a batch's loss is divided by: its real (non-padding) tokens, or with tag
    weights the sum of their tags' weights (cross_entropy's own weighted mean). Read
    from the batch alone, with no forward pass, so an accumulation window knows its
    size before any backward; counted where the batch is, so the host never waits for
    the device."""
    _, targets = batch
    real = targets != IGNORE_INDEX
    weight = loss_args.get("weight")
    if weight is None:
        return real.sum()
    return weight[targets[real]].sum()


def validation_sums(model, batch, data_info: dict) -> torch.Tensor:
    """A validation batch's loss (weighted as in training, no label smoothing), its
    tokens' weights, correct and real tokens, and true positive, predicted and gold
    entities. train.py's evaluate() adds them up over the whole set (and every
    rank) and hands them to validation_metrics; data_info is what data.py's
    build_datasets returned (its tag names)."""
    inputs, targets = batch
    logits = model(inputs)
    real = targets != IGNORE_INDEX
    predictions = logits.argmax(-1)
    loss_args = {"weight": class_weight(data_info, targets.device)}
    loss = summed_loss(logits, targets, **loss_args)
    weights = loss_count(batch, loss_args)
    correct = (predictions == targets)[real].sum()
    tp, n_pred, n_gold = count_entities(predictions, targets, data_info["tags"])
    sums = [loss.item(), weights.item(), correct.item(), real.sum().item()]
    sums += [tp, n_pred, n_gold]
    return torch.tensor(sums, dtype=torch.float64, device=targets.device)


def validation_metrics(sums: torch.Tensor) -> dict:
    """What train.py logs (and selects best.pt by), from validation_sums' totals:
    the entity F1 is exact (micro, over the whole set), not a mean over batches."""
    loss, weights, correct, count, tp, n_pred, n_gold = sums.tolist()
    f1 = 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0
    return {"val_loss": loss / weights, "val_acc": correct / count, "val_f1": f1}


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
    <out-dir>/model/ that train.py exported, loaded with transformers alone, with the
    tokenizer saved in it; the label names are in its config.json, the run's config
    beside the folder."""
    cfg = load_run_config(folder)
    cfg.model = str(folder)  # the tokenizer is read from the folder too
    try:
        transformer = AutoModelForTokenClassification.from_pretrained(folder)
        tokenizer = load_tokenizer(cfg)
    except (OSError, ValueError) as exc:
        reason = (str(exc).strip() or type(exc).__name__).splitlines()[0][:120]
        raise SystemExit(
            f"error: {folder}: not a model folder written by train.py ({reason})"
        ) from None
    labels = transformer.config.id2label
    names = [labels[i] for i in range(len(labels))]
    data = {"tags": names, "pad_id": tokenizer.pad_token_id}
    model = PretrainedTagger(transformer, tokenizer.pad_token_id)
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
    needed = {"tags", "pad_id"}  # [pretrained]
    fields = checkpoint.keys() if isinstance(checkpoint, dict) else set()
    data = checkpoint.get("data") if {"model", "config"} <= fields else None
    config = checkpoint.get("config") if data is not None else None
    # the task train.py wrote it for (files of template versions before 27 name none)
    task = checkpoint.get("task") if data is not None else None
    if task not in (None, "token-classification"):
        raise SystemExit(
            f"error: {path}: a {task} checkpoint, not token-classification;"
            " pass a best.pt or final.pt written by this project's train.py"
        )
    if not (
        isinstance(data, dict) and needed <= data.keys() and isinstance(config, dict)
    ):
        raise SystemExit(
            f"error: {path}: not a token-classification checkpoint;"
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
