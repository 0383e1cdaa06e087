"""Data: built-in synthetic sentences, or your CSV/JSONL files with `text` and `label`
fields.

    DATA/train.csv   (or train.jsonl)   columns/keys: text, label
    DATA/val.csv     (or val.jsonl)
    DATA/test.csv    (or test.jsonl; optional: for evaluate.py --split test)

The vocabulary (words of the training split) and the label names are stored in every
checkpoint, so evaluating a checkpoint uses the same ids.
"""

import csv
import json
import random
import re
from collections import Counter
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

PAD_ID, UNK_ID = 0, 1
# the built-in splits (build_datasets draws train and val with these seeds)
SYNTHETIC_SEEDS = {"train": 1, "val": 2, "test": 3}
TOPICS = {
    "sports": "goal match team coach season player score league stadium referee",
    "science": "atom theory experiment cell energy planet molecule physics gene data",
    "food": "recipe bread sauce cheese dinner spicy oven garlic soup dessert",
    "travel": "flight hotel beach passport journey island museum train luggage tour",
}
FILLER = (
    "the a of and to in it is was on for with as at by this that we they very some"
).split()


def tokenize(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


def synthetic_examples(n: int, seed: int, source: str) -> list[tuple[str, str, str]]:
    """Sentences of filler words with a few words of one topic; the topic is the
    label."""
    rng = random.Random(seed)
    labels = sorted(TOPICS)
    examples = []
    for number in range(1, n + 1):
        label = rng.choice(labels)
        words = rng.choices(FILLER, k=rng.randint(4, 16)) + rng.choices(
            TOPICS[label].split(), k=rng.randint(1, 3)
        )
        rng.shuffle(words)
        examples.append((" ".join(words), label, f"{source} example {number}"))
    return examples


def read_examples(path: Path) -> list[tuple[str, str, str]]:
    """Read (text, label, "file:line") triples; any problem names the file and line."""
    examples = read_csv(path) if path.suffix == ".csv" else read_jsonl(path)
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def read_csv(path: Path) -> list[tuple[str, str, str]]:
    examples = []
    # utf-8-sig: also reads files saved with a byte-order mark (Excel's "CSV UTF-8")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"text", "label"} <= set(reader.fieldnames):
            raise ValueError(
                f"{path}:1: needs a header with columns text and label,"
                f" got {reader.fieldnames}"
            )
        for row in reader:
            if row["text"] is None or row["label"] in (None, ""):
                raise ValueError(f"{path}:{reader.line_num}: missing text or label")
            examples.append((row["text"], row["label"], f"{path}:{reader.line_num}"))
    return examples


def read_jsonl(path: Path) -> list[tuple[str, str, str]]:
    examples = []
    with open(path, encoding="utf-8-sig") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path}:{line_number}: not valid JSON ({exc.msg})"
                ) from None
            if not isinstance(record, dict) or not {"text", "label"} <= record.keys():
                raise ValueError(
                    f"{path}:{line_number}:"
                    " expected a JSON object with keys text and label"
                )
            examples.append(
                (str(record["text"]), str(record["label"]), f"{path}:{line_number}")
            )
    return examples


def find_split(root: Path, split: str) -> Path:
    for suffix in (".csv", ".jsonl"):
        if (root / f"{split}{suffix}").is_file():
            return root / f"{split}{suffix}"
    raise ValueError(
        f"{root / split}.csv: missing (expected {split}.csv or {split}.jsonl in {root})"
    )


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


def build_vocab(texts: list[list[str]], min_count: int) -> list[str]:
    counts = Counter(word for words in texts for word in words)
    words = sorted(
        (w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w)
    )
    return ["<pad>", "<unk>"] + words


def encode(examples, vocab: list[str], labels: list[str], max_length: int):
    ids = {word: i for i, word in enumerate(vocab)}
    label_ids = {label: i for i, label in enumerate(labels)}
    encoded = []
    for text, label, where in examples:
        if label not in label_ids:
            raise ValueError(
                f"{where}: label {label!r} does not occur in the training split"
            )
        encoded.append((text_to_ids(text, ids, max_length), label_ids[label]))
    return encoded


def text_to_ids(text: str, ids: dict[str, int], max_length: int) -> torch.Tensor:
    tokens = [ids.get(word, UNK_ID) for word in tokenize(text)[:max_length]]
    return torch.tensor(tokens or [UNK_ID])  # an empty text becomes one <unk>


def build_datasets(cfg):
    """Return (train_set, val_set, data_info); data_info (vocabulary, classes, class
    weights) goes in checkpoints."""
    if cfg.data_dir:
        train = read_examples(find_split(Path(cfg.data_dir), "train"))
        val = read_examples(find_split(Path(cfg.data_dir), "val"))
        # the labels that occur in the training split
        classes = sorted({label for _, label, _ in train})
    else:
        train = synthetic_examples(cfg.synthetic_train_size, 1, "synthetic train")
        val = synthetic_examples(cfg.synthetic_val_size, 2, "synthetic val")
        classes = sorted(TOPICS)
    vocab = build_vocab([tokenize(text) for text, _, _ in train], cfg.min_word_count)
    train_set = encode(train, vocab, classes, cfg.max_length)
    val_set = encode(val, vocab, classes, cfg.max_length)
    data_info = {"classes": classes, "vocab": vocab}
    labels = [label for _, label in train_set]
    data_info["class_weights"] = class_weights(cfg, labels, classes)
    return train_set, val_set, data_info


def build_eval_set(cfg, data_info: dict, split: str):
    """One split (train, val or test) encoded with the checkpoint's vocabulary and
    classes. Returns (dataset, sample names)."""
    if cfg.data_dir:
        examples = read_examples(find_split(Path(cfg.data_dir), split))
    else:
        size = cfg.synthetic_train_size if split == "train" else cfg.synthetic_val_size
        examples = synthetic_examples(
            size, SYNTHETIC_SEEDS[split], f"synthetic {split}"
        )
    dataset = encode(examples, data_info["vocab"], data_info["classes"], cfg.max_length)
    return dataset, [where for _, _, where in examples]


def collate(batch):
    """Pad token ids to the longest text of the batch; the model masks the padding."""
    tokens, labels = zip(*batch, strict=True)
    return pad_sequence(tokens, batch_first=True, padding_value=PAD_ID), torch.tensor(
        labels
    )
