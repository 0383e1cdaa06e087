"""The model: a small CNN by default, or any torchvision classifier with random
weights."""

import torch
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
