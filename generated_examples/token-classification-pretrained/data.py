"""Data: built-in synthetic sentences, or your CoNLL files (sequence labelling with BIO
tags).

    DATA/train.txt   one "token tag" per line (extra middle columns are ignored),
    DATA/val.txt     a blank line between sentences, -DOCSTART- lines skipped
    DATA/test.txt    (optional: for evaluate.py --split test)

The vocabulary and the tag names are stored in every checkpoint, so evaluating a
checkpoint uses the same ids. Padding gets the tag IGNORE_INDEX, which the loss and the
metrics skip.
"""

import random
from collections import Counter
from pathlib import Path

import torch
from transformers import (  # [pretrained]
    AutoConfig,
    AutoTokenizer,
    DataCollatorForTokenClassification,
)

# the tag of padding positions: cross_entropy and the metrics skip it
IGNORE_INDEX = -100
# the built-in splits (build_datasets draws train and val with these seeds)
SYNTHETIC_SEEDS = {"train": 1, "val": 2, "test": 3}
ENTITIES = {
    "PER": [
        "alice",
        "bob",
        "carol smith",
        "dan brown",
        "erin",
        "frank miller",
        "grace hopper",
        "heidi",
    ],
    "LOC": [
        "paris",
        "berlin",
        "new york",
        "lima",
        "oslo",
        "cape town",
        "tokyo",
        "rome",
    ],
    "ORG": [
        "acme corp",
        "globex",
        "initech",
        "united nations",
        "red cross",
        "umbrella group",
    ],
}
FILLER = (
    "the a met visited in at from with and said today yesterday joined left"
    " for to of near"
).split()


def synthetic_sentences(n: int, seed: int) -> list[tuple[list[str], list[str], int]]:
    """Filler words with one to three entities; sentence lengths vary widely (2 to 42
    words)."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words, tags = [], []
        for _ in range(rng.randint(1, 3)):
            filler = rng.choices(FILLER, k=rng.randint(1, 12))
            words += filler
            tags += ["O"] * len(filler)
            kind = rng.choice(sorted(ENTITIES))
            entity = rng.choice(ENTITIES[kind]).split()
            words += entity
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
        sentences.append((words, tags, 0))
    return sentences


def read_conll(path: Path) -> list[tuple[list[str], list[str], int]]:
    """(words, tags, line of the first word) per sentence; a bad line names the file and
    line."""
    if not path.is_file():
        raise ValueError(
            f"{path}: missing;"
            f" expected CoNLL files train.txt and val.txt in {path.parent}"
        )
    sentences, words, tags = [], [], []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            columns = line.split()
            if not columns or columns[0] == "-DOCSTART-":
                if words:
                    sentences.append((words, tags, line_number - len(words)))
                    words, tags = [], []
                continue
            if len(columns) < 2:
                raise ValueError(
                    f"{path}:{line_number}: expected 'token tag', got {line.strip()!r}"
                )
            tag = columns[-1]
            if tag != "O" and not (tag[:2] in ("B-", "I-") and len(tag) > 2):
                raise ValueError(
                    f"{path}:{line_number}: tag {tag!r} is not O, B-TYPE or I-TYPE"
                )
            words.append(columns[0])
            tags.append(tag)
    if words:
        sentences.append((words, tags, line_number + 1 - len(words)))
    if not sentences:
        raise ValueError(f"{path}: no sentences")
    return sentences


def class_weights(cfg, labels: list[int], names: list[str]) -> list[float] | None:
    """--class-weights balanced: a tag of n training tokens weighs N / (tags x n), as
    scikit-learn's "balanced" does (rare tags weigh more, the mean weight of a token is
    1); none: None, every tag weighs 1. In data_info, so in every checkpoint."""
    if cfg.class_weights == "none":
        return None
    counts = Counter(labels)
    for i, name in enumerate(names):
        if not counts[i]:
            raise ValueError(
                f"--class-weights balanced: no training token is tag {name!r};"
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
                "save_pretrained, or a hub name such as bert-base-cased"
            )
    if source.is_dir() and not (source / "config.json").is_file():
        raise ValueError(
            f"--model {cfg.model}: this directory holds no saved model "
            "(no config.json); pass the folder save_pretrained wrote, or a hub name"
        )
    try:
        # RoBERTa/GPT-2 style BPE needs add_prefix_space=True for words given one by one
        tokenizer = AutoTokenizer.from_pretrained(cfg.model, add_prefix_space=True)
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
        self.collator = DataCollatorForTokenClassification(tokenizer)

    def __call__(self, batch):
        padded = self.collator(batch)
        return padded["input_ids"], padded["labels"]


def align_labels(
    word_ids: list, tag_ids: list[int], begin_to_inside: dict, all_subwords: bool
) -> list[int]:
    """[pretrained] One target per sub-word token: the first sub-word of a word carries
    the word's tag; the other sub-words IGNORE_INDEX (or, with all_subwords, the tag,
    B-X continued as I-X); special tokens ([CLS], <s>, ...) IGNORE_INDEX."""
    targets, previous = [], None
    for word in word_ids:
        if word is None:
            targets.append(IGNORE_INDEX)
        elif word != previous:
            targets.append(tag_ids[word])
        elif all_subwords:
            targets.append(begin_to_inside.get(tag_ids[word], tag_ids[word]))
        else:
            targets.append(IGNORE_INDEX)
        previous = word
    return targets


def encode(
    sentences,
    tokenizer,
    tag_names: list[str],
    max_length: int,
    source: str,
    all_subwords: bool,
):
    """[pretrained] Sub-word ids of each sentence (words given one by one, truncated to
    max_length sub-words) and one target per sub-word (see align_labels)."""
    tag_ids = {tag: i for i, tag in enumerate(tag_names)}
    begin_to_inside = {
        i: tag_ids.get("I-" + tag[2:], i)
        for tag, i in tag_ids.items()
        if tag.startswith("B-")
    }
    encoded = []
    for words, tags, first_line in sentences:
        for i, tag in enumerate(tags):
            if tag not in tag_ids:
                raise ValueError(
                    f"{source}:{first_line + i}: tag {tag!r}"
                    " does not occur in the training split"
                )
        tokens = tokenizer(
            words, is_split_into_words=True, truncation=True, max_length=max_length
        )
        word_tags = [tag_ids[tag] for tag in tags]
        targets = align_labels(
            tokens.word_ids(), word_tags, begin_to_inside, all_subwords
        )
        encoded.append({"input_ids": tokens["input_ids"], "labels": targets})
    return encoded


def build_datasets(cfg, tokenizer):
    """[pretrained] Return (train_set, val_set, data_info); data_info (the tags, the
    padding id, the tag weights) goes in checkpoints."""
    if cfg.data_dir:
        train_path = Path(cfg.data_dir, "train.txt")
        val_path = Path(cfg.data_dir, "val.txt")
        train, val = read_conll(train_path), read_conll(val_path)
        # the tags that occur in the training split
        tag_set = {tag for _, tags, _ in train for tag in tags}
    else:
        train_path, val_path = "synthetic train", "synthetic val"
        train = synthetic_sentences(cfg.synthetic_train_size, 1)
        val = synthetic_sentences(cfg.synthetic_val_size, 2)
        tag_set = {f"{prefix}-{kind}" for kind in ENTITIES for prefix in "BI"}
    tag_names = check_head(cfg.model, ["O"] + sorted(tag_set - {"O"}))  # [pretrained]
    train_set = encode(
        train,
        tokenizer,
        tag_names,
        cfg.max_length,
        str(train_path),
        cfg.label_all_subwords,
    )
    # validation labels first sub-words only: its metrics are per word
    val_set = encode(val, tokenizer, tag_names, cfg.max_length, str(val_path), False)
    data_info = {"tags": tag_names, "pad_id": tokenizer.pad_token_id}
    labels = [
        tag for example in train_set for tag in example["labels"] if tag != IGNORE_INDEX
    ]
    data_info["class_weights"] = class_weights(cfg, labels, tag_names)
    return train_set, val_set, data_info


def build_eval_set(cfg, data_info: dict, split: str, tokenizer):
    """[pretrained] One split (train, val or test) encoded with the model's tokenizer
    and the checkpoint's tags; first sub-words labelled only (metrics per word).
    Returns (dataset, sample names)."""
    if cfg.data_dir:
        path = Path(cfg.data_dir, f"{split}.txt")
        sentences, source = read_conll(path), str(path)
    else:
        size = cfg.synthetic_train_size if split == "train" else cfg.synthetic_val_size
        sentences = synthetic_sentences(size, SYNTHETIC_SEEDS[split])
        source = f"synthetic {split}"
    dataset = encode(
        sentences, tokenizer, data_info["tags"], cfg.max_length, source, False
    )
    if cfg.data_dir:
        return dataset, [f"{source}:{line}" for _, _, line in sentences]
    return dataset, [f"{source} {i}" for i in range(len(sentences))]


def entity_spans(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, start, end) of each entity in a BIO sequence, as seqeval's default mode
    reads it: an entity starts at B-X, or at an I-X that does not continue an X
    entity."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, label = tag.partition("-")
        if start is not None and (prefix != "I" or label != kind):
            spans.add((kind, start, i))
            start = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, label
    return spans


def count_entities(
    predictions: torch.Tensor, targets: torch.Tensor, tag_names: list[str]
):
    """(true positives, predicted entities, gold entities) over a batch, for
    entity-level F1."""
    tp = n_pred = n_gold = 0
    for predicted, gold in zip(predictions.tolist(), targets.tolist(), strict=True):
        real = [i for i, t in enumerate(gold) if t != IGNORE_INDEX]
        pred_spans = entity_spans([tag_names[predicted[i]] for i in real])
        gold_spans = entity_spans([tag_names[gold[i]] for i in real])
        tp += len(pred_spans & gold_spans)
        n_pred += len(pred_spans)
        n_gold += len(gold_spans)
    return tp, n_pred, n_gold
