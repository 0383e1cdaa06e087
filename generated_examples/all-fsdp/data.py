"""Data: built-in synthetic images, or your images in torchvision's ImageFolder layout.

    DATA/train/<class name>/*.png|jpg
    DATA/val/<class name>/*.png|jpg
    DATA/test/<class name>/*.png|jpg    (optional: for evaluate.py --split test)

The class names (folder names) come from DATA/train; DATA/val must have the same
folders.
"""

from collections import Counter
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms import v2

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics
SYNTHETIC_CLASSES = ["horizontal-stripes", "vertical-stripes", "checkerboard", "disk"]
# the built-in splits (build_datasets draws train and val with these seeds)
SYNTHETIC_SEEDS = {"train": 1, "val": 2, "test": 3}


def transforms(image_size: int, augment: str = "none") -> v2.Compose:
    """Resize and normalise; `augment` (the training split's --augment): crop shifts the
    image by up to 1/8 of its size, crop+flip also mirrors it (photos, not digits or
    text)."""
    steps = [v2.ToImage(), v2.Resize((image_size, image_size), antialias=True)]
    if augment in ("crop", "crop+flip"):
        steps.append(v2.RandomCrop(image_size, padding=image_size // 8))
    if augment == "crop+flip":
        steps.append(v2.RandomHorizontalFlip())
    steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose(steps)


class SyntheticImages(Dataset):
    """Coloured stripes, checkerboards and disks with random frequency, phase, position
    and noise: learnable by a small CNN, generated in memory from a fixed seed (no
    download)."""

    def __init__(self, size: int, image_size: int, seed: int, transform):
        g = torch.Generator().manual_seed(seed)
        n, s = size, image_size
        self.labels = torch.randint(0, len(SYNTHETIC_CLASSES), (n,), generator=g)
        ys, xs = torch.meshgrid(
            torch.arange(s).float(), torch.arange(s).float(), indexing="ij"
        )
        freq = torch.randint(2, 5, (n, 1, 1), generator=g) * 2 * torch.pi / s
        phase = torch.rand(n, 1, 1, generator=g) * 2 * torch.pi
        rows, cols = torch.sin(ys * freq + phase) > 0, torch.sin(xs * freq + phase) > 0
        cy, cx = (torch.rand(2, n, 1, 1, generator=g) * 0.5 + 0.25) * s
        radius = (torch.rand(n, 1, 1, generator=g) * 0.15 + 0.2) * s
        disk = (ys - cy) ** 2 + (xs - cx) ** 2 < radius**2
        patterns = torch.stack([rows, cols, rows ^ cols, disk], 1)[
            torch.arange(n), self.labels
        ]
        background = torch.rand(n, 3, 1, 1, generator=g) * 0.4
        foreground = torch.rand(n, 3, 1, 1, generator=g) * 0.4 + 0.6
        images = torch.where(patterns.unsqueeze(1), foreground, background)
        images = images + 0.1 * torch.randn(n, 3, s, s, generator=g)
        self.images = (images.clamp(0, 1) * 255).to(torch.uint8)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.transform(self.images[index]), int(self.labels[index])


def build_datasets(cfg):
    """Return (train_set, val_set, data_info); data_info (the classes, the class
    weights) is stored in every checkpoint."""
    if not cfg.data_dir:
        train_set = SyntheticImages(
            cfg.synthetic_train_size,
            cfg.image_size,
            1,
            transforms(cfg.image_size, cfg.augment),
        )
        val_set = SyntheticImages(
            cfg.synthetic_val_size, cfg.image_size, 2, transforms(cfg.image_size)
        )
        weights = class_weights(cfg, train_set.labels.tolist(), SYNTHETIC_CLASSES)
        data_info = {"classes": SYNTHETIC_CLASSES, "class_weights": weights}
        return train_set, val_set, data_info
    root = Path(cfg.data_dir)
    splits = {}
    for split in ("train", "val"):
        folder = root / split
        if not folder.is_dir():
            raise ValueError(
                f"{folder}: missing; expected {root}/train/<class>/*.png"
                f" and {root}/val/<class>/*.png"
            )
        try:
            augment = cfg.augment if split == "train" else "none"
            transform = transforms(cfg.image_size, augment)
            splits[split] = datasets.ImageFolder(
                folder,
                transform=transform,
                loader=load_image,
                is_valid_file=check_image,
            )
        except FileNotFoundError as exc:  # no class folders, or no images in them
            raise ValueError(f"{folder}: {exc}") from None
    classes = splits["train"].classes
    for name in splits["val"].classes:
        if name not in classes:
            raise ValueError(
                f"{root / 'val' / name}: class {name!r}"
                f" has no folder in {root / 'train'}"
            )
    # ImageFolder numbers the classes of each split by their sorted names:
    # they must be the same
    if splits["val"].classes != classes:
        missing = sorted(set(classes) - set(splits["val"].classes))
        raise ValueError(
            f"{root / 'val'}: no folder for class {missing[0]!r};"
            " val needs the class folders of train"
        )
    data_info = {"classes": classes}
    data_info["class_weights"] = class_weights(cfg, splits["train"].targets, classes)
    return splits["train"], splits["val"], data_info


def class_weights(cfg, labels: list[int], names: list[str]) -> list[float] | None:
    """--class-weights balanced: a class of n training samples weighs N / (classes x n),
    as scikit-learn's "balanced" does (rare classes weigh more, the mean weight of a
    sample is 1); none: None, every class weighs 1. Kept in every checkpoint."""
    if cfg.class_weights == "none":
        return None
    counts = Counter(labels)
    for i, name in enumerate(names):
        if not counts[i]:
            raise ValueError(
                f"--class-weights balanced: no training sample is class {name!r};"
                " use --class-weights none"
            )
    return [len(labels) / (len(names) * counts[i]) for i in range(len(names))]


class TrainedClassFolder(datasets.ImageFolder):
    """ImageFolder numbered with the classes of training (from the checkpoint), so a
    split may lack a class and still gets the label ids the model learned."""

    def __init__(self, root: Path, classes: list[str], transform):
        self.trained_classes = classes
        super().__init__(
            root,
            transform=transform,
            loader=load_image,
            is_valid_file=check_image,
            allow_empty=True,
        )

    def find_classes(self, directory):
        return self.trained_classes, {
            name: i for i, name in enumerate(self.trained_classes)
        }


def build_eval_set(cfg, data_info: dict, split: str):
    """One split (train, val or test) with the evaluation transforms, never the
    augmentation; labels numbered as in training. Returns (dataset, sample names)."""
    transform = transforms(cfg.image_size)
    if not cfg.data_dir:
        size = cfg.synthetic_train_size if split == "train" else cfg.synthetic_val_size
        dataset = SyntheticImages(
            size, cfg.image_size, SYNTHETIC_SEEDS[split], transform
        )
        return dataset, [f"synthetic {split} {i}" for i in range(len(dataset))]
    folder = Path(cfg.data_dir) / split
    if not folder.is_dir():
        raise ValueError(f"{folder}: missing; expected {folder}/<class>/*.png")
    classes = data_info["classes"]
    for path in sorted(folder.iterdir()):
        if path.is_dir() and path.name not in classes:
            raise ValueError(
                f"{path}: class {path.name!r} was not in the training split"
            )
    dataset = TrainedClassFolder(folder, classes, transform)
    if not dataset.samples:
        raise ValueError(f"{folder}: no images in its class folders")
    return dataset, [path for path, _ in dataset.samples]


def check_image(path: str) -> bool:
    """ImageFolder calls this for every file it finds. Image files are opened once (PIL
    reads only the header, about a second per 10,000 files), so a file that is not an
    image stops the run here, with its name, not in the middle of an epoch. Other files
    are skipped."""
    if not path.lower().endswith(IMG_EXTENSIONS):
        return False  # e.g. .DS_Store or notes.txt
    try:
        with Image.open(path):
            return True
    except OSError as exc:  # PIL's UnidentifiedImageError is an OSError
        raise ValueError(f"{path}: not a readable image ({exc})") from None


def load_image(path: str):
    """Decode an image as RGB (grayscale and RGBA files too); a damaged file names
    itself."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except OSError as exc:  # e.g. a truncated file whose header was fine
        raise ValueError(f"{path}: not a readable image ({exc})") from None
