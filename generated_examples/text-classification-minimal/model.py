"""The model: word embeddings, a transformer encoder, masked mean pooling and a
linear classifier."""

import torch
from torch import nn

from data import PAD_ID


class TextClassifier(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        embed_dim: int,
        num_layers: int,
        num_heads: int,
        dropout: float,
        max_length: int,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD_ID)
        self.position = nn.Embedding(max_length, embed_dim)
        layer = nn.TransformerEncoderLayer(
            embed_dim,
            num_heads,
            dim_feedforward=2 * embed_dim,
            dropout=dropout,
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers, enable_nested_tensor=False
        )
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        mask = token_ids != PAD_ID  # True for real words, False for padding
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        hidden = self.encoder(
            self.embed(token_ids) + self.position(positions), src_key_padding_mask=~mask
        )
        # masked mean pooling: padding contributes nothing, whatever the batch's
        # padded length
        mask = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(pooled)


def build_model(cfg, data_info: dict) -> nn.Module:
    return TextClassifier(
        vocab_size=len(data_info["vocab"]),
        num_classes=len(data_info["classes"]),
        embed_dim=cfg.embed_dim,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        dropout=cfg.dropout,
        max_length=cfg.max_length,
    )
