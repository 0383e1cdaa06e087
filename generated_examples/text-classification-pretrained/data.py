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
from collections import Counter
from pathlib import Path

from transformers import (
    AutoConfig,
    AutoTokenizer,
    DataCollatorWithPadding,
)  # [pretrained]

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


def load_tokenizer(cfg):
    """[pretrained] The tokenizer of --model (a hub name, or a folder written by
    save_pretrained), checked against the model's config before anything is trained."""
    source = Path(cfg.model).expanduser()
    if cfg.model.startswith(("/", ".", "~")) or cfg.model.count("/") > 1:
        if not source.is_dir():
            raise ValueError(
                f"--model {cfg.model}: no such directory; pass a folder written by "
                "save_pretrained, or a hub name such as distilbert-base-uncased"
            )
    if source.is_dir() and not (source / "config.json").is_file():
        raise ValueError(
            f"--model {cfg.model}: this directory holds no saved model "
            "(no config.json); pass the folder save_pretrained wrote, or a hub name"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        config = AutoConfig.from_pretrained(cfg.model)
    except (OSError, ValueError) as exc:
        reason = (
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        raise ValueError(
            f"--model {cfg.model}: cannot load it ({reason}); check the name and the "
            "network, or pass a local folder written by save_pretrained"
        ) from None
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"--model {cfg.model}: its tokenizer has {len(tokenizer)} tokens but the "
            f"model embeds only {config.vocab_size}: the tokenizer belongs to another "
            "model; save the model's own tokenizer beside it"
        )
    if tokenizer.pad_token is None:  # GPT-2 and Llama style tokenizers have none
        tokenizer.pad_token = tokenizer.eos_token
    # padding after the text: a decoder's positions count from its first real token
    tokenizer.padding_side = "right"
    return tokenizer


def trained_head_labels(model_name: str) -> list[str]:
    """[pretrained] The label names of a model that already has a fine-tuned head (its
    config names them); [] for a base model (transformers' defaults LABEL_0, ...)."""
    id2label = AutoConfig.from_pretrained(model_name).id2label
    names = [id2label[i] for i in range(len(id2label))]
    return [] if all(name == f"LABEL_{i}" for i, name in enumerate(names)) else names


def check_head(model_name: str, labels: list[str]) -> list[str]:
    """[pretrained] The label order to train with: a fine-tuned head keeps its own (its
    weights still mean the same labels) and must know every label of the data."""
    head = trained_head_labels(model_name)
    if not head:
        return labels
    extra = [label for label in labels if label not in head]
    if extra:
        raise ValueError(
            f"--model {model_name}: its head was trained for {len(head)} labels "
            f"({', '.join(head[:8])}); the data has {len(extra)} more "
            f"({', '.join(extra[:8])}): pass the base model without a head, or data "
            "with only those labels"
        )
    return head


class Collate:
    """[pretrained] Pads each batch to its longest sequence with the tokenizer's
    collator (dynamic padding); returns (token ids, labels). The model rebuilds the
    attention mask from the padding id."""

    def __init__(self, tokenizer):
        self.collator = DataCollatorWithPadding(tokenizer)

    def __call__(self, batch):
        padded = self.collator(batch)
        return padded["input_ids"], padded["labels"]


def encode(examples, tokenizer, labels: list[str], max_length: int):
    """[pretrained] Token ids of each text (the tokenizer's own, truncated to
    max_length sub-word tokens) and the label's id."""
    label_ids = {label: i for i, label in enumerate(labels)}
    encoded = []
    for text, label, where in examples:
        if label not in label_ids:
            raise ValueError(
                f"{where}: label {label!r} does not occur in the training split"
            )
        ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        encoded.append({"input_ids": ids, "labels": label_ids[label]})
    return encoded


def build_datasets(cfg, tokenizer):
    """[pretrained] Return (train_set, val_set, data_info); data_info (the classes,
    the padding id, the class weights) goes in checkpoints."""
    if cfg.data_dir:
        train = read_examples(find_split(Path(cfg.data_dir), "train"))
        val = read_examples(find_split(Path(cfg.data_dir), "val"))
        # the labels that occur in the training split
        classes = sorted({label for _, label, _ in train})
    else:
        train = synthetic_examples(cfg.synthetic_train_size, 1, "synthetic train")
        val = synthetic_examples(cfg.synthetic_val_size, 2, "synthetic val")
        classes = sorted(TOPICS)
    classes = check_head(cfg.model, classes)  # [pretrained]
    train_set = encode(train, tokenizer, classes, cfg.max_length)
    val_set = encode(val, tokenizer, classes, cfg.max_length)
    data_info = {"classes": classes, "pad_id": tokenizer.pad_token_id}
    labels = [example["labels"] for example in train_set]
    data_info["class_weights"] = class_weights(cfg, labels, classes)
    return train_set, val_set, data_info


def build_eval_set(cfg, data_info: dict, split: str, tokenizer):
    """[pretrained] One split (train, val or test) encoded with the model's tokenizer
    and the checkpoint's classes. Returns (dataset, sample names)."""
    if cfg.data_dir:
        examples = read_examples(find_split(Path(cfg.data_dir), split))
    else:
        size = cfg.synthetic_train_size if split == "train" else cfg.synthetic_val_size
        examples = synthetic_examples(
            size, SYNTHETIC_SEEDS[split], f"synthetic {split}"
        )
    dataset = encode(examples, tokenizer, data_info["classes"], cfg.max_length)
    return dataset, [where for _, _, where in examples]
