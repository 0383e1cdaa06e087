"""The model: a pretrained Hugging Face transformer with a new token classification
head."""

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForTokenClassification


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
