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
from torch.nn.utils.rnn import pad_sequence

PAD_ID, UNK_ID = 0, 1
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


def build_vocab(sentences, min_count: int) -> list[str]:
    counts = Counter(word.lower() for words, _, _ in sentences for word in words)
    words = sorted(
        (w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w)
    )
    return ["<pad>", "<unk>"] + words


def encode(
    sentences, vocab: list[str], tag_names: list[str], max_length: int, source: str
):
    ids = {word: i for i, word in enumerate(vocab)}
    tag_ids = {tag: i for i, tag in enumerate(tag_names)}
    encoded = []
    for words, tags, first_line in sentences:
        for i, tag in enumerate(tags):
            if tag not in tag_ids:
                raise ValueError(
                    f"{source}:{first_line + i}: tag {tag!r}"
                    " does not occur in the training split"
                )
        token_ids = words_to_ids(words, ids, max_length)
        targets = [tag_ids[tag] for tag in tags[:max_length]]
        encoded.append((token_ids, torch.tensor(targets)))
    return encoded


def words_to_ids(
    words: list[str], ids: dict[str, int], max_length: int
) -> torch.Tensor:
    return torch.tensor([ids.get(word.lower(), UNK_ID) for word in words[:max_length]])


def build_datasets(cfg):
    """Return (train_set, val_set, data_info); data_info (vocabulary, tags, tag
    weights) goes in checkpoints."""
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
    vocab = build_vocab(train, cfg.min_word_count)
    tag_names = ["O"] + sorted(tag_set - {"O"})
    train_set = encode(train, vocab, tag_names, cfg.max_length, str(train_path))
    val_set = encode(val, vocab, tag_names, cfg.max_length, str(val_path))
    data_info = {"tags": tag_names, "vocab": vocab}
    labels = [tag for _, tags in train_set for tag in tags.tolist()]
    data_info["class_weights"] = class_weights(cfg, labels, tag_names)
    return train_set, val_set, data_info


def build_eval_set(cfg, data_info: dict, split: str):
    """One split (train, val or test) encoded with the checkpoint's vocabulary and tags.
    Returns (dataset, sample names)."""
    if cfg.data_dir:
        path = Path(cfg.data_dir, f"{split}.txt")
        sentences, source = read_conll(path), str(path)
    else:
        size = cfg.synthetic_train_size if split == "train" else cfg.synthetic_val_size
        sentences = synthetic_sentences(size, SYNTHETIC_SEEDS[split])
        source = f"synthetic {split}"
    dataset = encode(
        sentences, data_info["vocab"], data_info["tags"], cfg.max_length, source
    )
    if cfg.data_dir:
        return dataset, [f"{source}:{line}" for _, _, line in sentences]
    return dataset, [f"{source} {i}" for i in range(len(sentences))]


def collate(batch):
    """Pad to the longest sentence of the batch: ids with PAD_ID, tags with
    IGNORE_INDEX."""
    tokens, tags = zip(*batch, strict=True)
    return (
        pad_sequence(tokens, batch_first=True, padding_value=PAD_ID),
        pad_sequence(tags, batch_first=True, padding_value=IGNORE_INDEX),
    )


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
