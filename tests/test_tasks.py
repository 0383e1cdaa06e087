"""Issue 7: the three tasks (image-classification, text-classification, token-classification).

Quality thresholds on the built-in data, `python train.py` with its defaults on a CPU (the only
flag is --out-dir), final validation metrics after the default epochs:

    image-classification   val_acc >= 0.8    (4 classes; chance 0.25)
    text-classification    val_acc >= 0.9    (4 topics; chance 0.25)
    token-classification   val_f1  >= 0.9    (entity-level F1, as seqeval computes it)

What the tests prove:
- rendering: every task renders with each feature alone and with all of them, black- and
  ruff-clean (F, E9), and the `<task>-minimal` / `<task>-all` snapshots are named examples;
- the defaults reach the thresholds above;
- real on-disk data trains: PNG/JPEG files (RGB, grayscale, RGBA) in ImageFolder layout, a CSV
  (with a byte-order mark, quoted commas and an extra column) and a JSONL file, a CoNLL file with
  a -DOCSTART- line and a POS middle column; the classes/tags and the vocabulary in final.pt come
  from the data;
- a missing or malformed file stops the run with one line naming the file (and line): all cases
  through the runner, three of them also as a real `python train.py` (stderr, exit status);
- token loss normalisation (PITFALLS.md section 2): K micro-batches of b sentences of very
  different lengths give the weights of one batch of K*b, and a copy of train.py that averages
  per-micro-batch means does not;
- entity-level F1: data.entity_spans / count_entities against hand-worked BIO examples (checked
  against seqeval 1.2.2's get_entities when they were written) and a transcription of seqeval's
  chunk rules on random tag sequences;
- `--arch resnet18` builds a torchvision model with random weights (nothing downloaded) and
  trains one step on 32 px images.

All training runs go through ONE runner process (the module fixture `runs`), with one torch
thread (this machine has 2 cores shared by many processes; spinning OpenMP threads only slow it).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import render_project, run_jobs
from scaffold.catalogue import FEATURES, TASKS
from scaffold.examples import ALL, ALL_FSDP, EXAMPLES

IMAGE, TEXT, TOKENS = "image-classification", "text-classification", "token-classification"
THRESHOLDS = {IMAGE: ("val_acc", 0.8), TEXT: ("val_acc", 0.9), TOKENS: ("val_f1", 0.9)}


# --- rendering -----------------------------------------------------------------------------


@pytest.mark.parametrize("task", list(TASKS))
def test_task_renders_with_each_feature_and_all_black_and_ruff_clean(task, tmp_path):
    combos = {name: [name, *FEATURES[name].requires] for name in FEATURES}
    # the largest renders: ddp and fsdp conflict
    combos["all"] = [f for f in FEATURES if f != "fsdp"]
    combos["all-fsdp"] = [f for f in FEATURES if f != "ddp"]
    for name, features in combos.items():
        project = render_project(tmp_path / name, task, features)
        # every generated file but scaffold's record (export tags requirements.txt, not train.py)
        files = [p for p in project.rglob("*") if p.is_file() and ".scaffold" not in p.parts]
        text = "".join(p.read_text() for p in files)
        for feature in FEATURES:  # each selected feature's tagged lines are there, no others
            assert (f"# [{feature}]" in text) == (feature in features), (task, name, feature)
    black = subprocess.run([sys.executable, "-m", "black", "--check", "-q", str(tmp_path)],
                           capture_output=True, text=True)
    assert black.returncode == 0, black.stderr
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated",
                           "--select", "F,E9", str(tmp_path)], capture_output=True, text=True)
    assert ruff.returncode == 0, ruff.stdout


@pytest.mark.parametrize("task", [TEXT, TOKENS])
def test_task_snapshots_are_named_examples(task):
    assert EXAMPLES[f"{task}-minimal"] == (task, [])
    # `all` is every from-scratch loop feature but fsdp (it conflicts with ddp; `all-fsdp` has
    # it): no trackers, no sweep; `<task>-pretrained` and -pretrained-all add pretrained
    assert EXAMPLES[f"{task}-all"] == (task, ALL)
    assert not {"pretrained", "fsdp", "mlflow", "wandb", "sweep"} & set(ALL)
    assert EXAMPLES[f"{task}-pretrained"] == (task, ["pretrained"])


# --- entity-level F1 (seqeval's definition) --------------------------------------------------


@pytest.fixture(scope="module")
def token_data(tmp_path_factory):
    """The data module of a freshly rendered token-classification project."""
    project = render_project(tmp_path_factory.mktemp("tokens") / "p", TOKENS)
    spec = importlib.util.spec_from_file_location("generated_token_data", project / "data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (tags, entities as (type, start, end) with end exclusive). Worked by hand from seqeval's default
# (non-strict IOB2) reading; seqeval 1.2.2's get_entities gives the same (its end is inclusive).
BIO_CASES = [
    (["B-PER", "I-PER", "O", "B-LOC"], {("PER", 0, 2), ("LOC", 3, 4)}),
    (["O", "I-PER", "I-PER", "O"], {("PER", 1, 3)}),  # I- without B- starts an entity
    (["I-LOC"], {("LOC", 0, 1)}),
    (["B-PER", "I-LOC", "I-LOC"], {("PER", 0, 1), ("LOC", 1, 3)}),  # a type change starts a new one
    (["B-PER", "B-PER", "I-PER"], {("PER", 0, 1), ("PER", 1, 3)}),  # adjacent B- B-: two entities
    (["B-ORG", "I-PER", "B-PER"], {("ORG", 0, 1), ("PER", 1, 2), ("PER", 2, 3)}),
    (["O", "O"], set()),
    (["O", "B-MISC", "I-MISC"], {("MISC", 1, 3)}),  # an entity that ends the sentence
    (["B-LOC", "I-LOC", "I-PER", "O", "I-PER", "B-LOC", "B-ORG"],
     {("LOC", 0, 2), ("PER", 2, 3), ("PER", 4, 5), ("LOC", 5, 6), ("ORG", 6, 7)}),
]


@pytest.mark.parametrize("tags, expected", BIO_CASES)
def test_entity_spans_hand_worked(token_data, tags, expected):
    assert token_data.entity_spans(tags) == expected


def seqeval_entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """seqeval 1.2.2 get_entities (default mode), its end_of_chunk/start_of_chunk rules for B/I/O
    tags transcribed; returned with an exclusive end."""
    chunks, prev_tag, prev_type, begin = set(), "O", "", 0
    for i, chunk in enumerate(tags + ["O"]):
        tag, type_ = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
        end = (prev_tag in "BI" and tag in "BO") or (prev_tag != "O" and prev_type != type_)
        start = tag == "B" or (prev_tag == "O" and tag == "I") or (tag != "O" and prev_type != type_)
        if end:
            chunks.add((prev_type, begin, i))
        if start:
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def test_entity_spans_match_seqeval_rules_on_random_sequences(token_data):
    rng = random.Random(0)
    vocabulary = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    for case in range(3000):
        tags = rng.choices(vocabulary, k=rng.randint(0, 9))
        assert token_data.entity_spans(tags) == seqeval_entities(tags), tags


def test_count_entities_skips_padding_and_counts_exact_spans(token_data):
    import torch

    names = ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
    O, BL, BP, IL, IP, PAD = 0, 1, 2, 3, 4, token_data.IGNORE_INDEX
    gold = torch.tensor([
        [BP, IP, O, BL, PAD, PAD],  # PER 0-2, LOC 3-4
        [O, IL, IL, O, BP, BP],  # LOC 1-3, PER 4-5, PER 5-6
    ])
    predicted = torch.tensor([
        [BP, IP, O, BL, IL, IL],  # right; the I-LOC on padding must not extend LOC 3-4
        [O, BL, IL, O, BP, IP],  # LOC 1-3 right (B vs I start), PER 4-6 wrong (one merged span)
    ])
    tp, n_pred, n_gold = token_data.count_entities(predicted, gold, names)
    assert (tp, n_pred, n_gold) == (3, 4, 5)
    # the micro F1 over spans, seqeval's f1_score: 2PR/(P+R) = 2tp/(pred+gold)
    assert 2 * tp / (n_pred + n_gold) == pytest.approx(2 * (3 / 4) * (3 / 5) / (3 / 4 + 3 / 5))


# --- on-disk data writers ----------------------------------------------------------------------

COLOURS = {"blue": 2, "green": 1, "red": 0}  # class name -> the channel that dominates its images


def write_image_folder(root: Path, per_class: dict[str, int], size: int = 40) -> Path:
    """DATA/train and DATA/val with one folder per class: real PNG files (RGB, RGBA and one
    grayscale), one JPEG, and a notes.txt that ImageFolder must ignore."""
    from PIL import Image

    rng = random.Random(0)
    for split, n in per_class.items():
        for name, channel in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = bytearray()
                for _ in range(size * size):
                    rgb = [rng.randrange(0, 90) for _ in range(3)]
                    rgb[channel] = rng.randrange(170, 256)
                    pixels += bytes(rgb)
                image = Image.frombytes("RGB", (size, size), bytes(pixels))
                if i == 1:
                    image.convert("RGBA").save(folder / f"{i}.png")
                elif i == 2:
                    image.save(folder / f"{i}.jpg", quality=95)
                elif i == 3 and name == "green":
                    image.convert("L").save(folder / f"{i}.png")
                else:
                    image.save(folder / f"{i}.png")
    (root / "train" / "red" / "notes.txt").write_text("not an image, and not named like one\n")
    return root


TEXT_WORDS = {
    "positive": "great lovely excellent superb wonderful",
    "negative": "awful terrible boring dreadful poor",
    "neutral": "average okay plain ordinary fine",
}
FILLER = "the film was and it a plot with acting very".split()


def text_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = sorted(TEXT_WORDS)[i % 3]
        words = rng.choices(FILLER, k=rng.randint(2, 8)) + rng.choices(TEXT_WORDS[label].split(), k=3)
        rng.shuffle(words)
        text = " ".join(words) + (', she said "really"' if i % 2 else "")  # quotes and commas in CSV
        rows.append({"id": i, "text": text, "label": label})
    return rows


def write_csv(path: Path, rows: list[dict], fields=("text", "label", "id")) -> None:
    # utf-8-sig: a byte-order mark first, as Excel writes "CSV UTF-8" (it sticks to "text" if read
    # as plain utf-8)
    with open(path, "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    lines = [json.dumps({"text": r["text"], "label": r["label"]}) for r in rows]
    lines.insert(len(lines) // 2, "")  # a blank line is allowed
    path.write_text("\n".join(lines) + "\n")


CONLL_ENTITIES = {"PER": ["Alice", "Bob Stone", "Carla"], "LOC": ["Paris", "New York", "Lima"],
                  "MISC": ["Olympics", "World Cup"]}


def conll_text(n: int, seed: int) -> str:
    """CoNLL-2003 style: `token POS tag`, a -DOCSTART- line, blank lines between sentences."""
    rng = random.Random(seed)
    lines = ["-DOCSTART- -X- O", ""]
    for _ in range(n):
        for _ in range(rng.randint(1, 2)):
            lines += [f"{w} DT O" for w in rng.choices(FILLER, k=rng.randint(1, 6))]
            kind = rng.choice(sorted(CONLL_ENTITIES))
            words = rng.choice(CONLL_ENTITIES[kind]).split()
            lines += [f"{w} NNP {'B' if j == 0 else 'I'}-{kind}" for j, w in enumerate(words)]
        lines.append("")
    return "\n".join(lines) + "\n"


def conll_tags(text: str) -> set[str]:
    return {line.split()[-1] for line in text.splitlines() if line.strip() and not line.startswith("-DOCSTART-")}


# --- error cases: (task, writer(root) -> what the one-line message must contain) -----------------


def bad_missing_val(root: Path):
    write_csv(root / "train.csv", text_rows(6, 1))
    return [str(root / "val.csv"), "missing"]


def bad_csv_without_label(root: Path):
    write_csv(root / "train.csv", text_rows(6, 1), fields=("text", "id"))
    write_csv(root / "val.csv", text_rows(3, 2))
    return [f"{root / 'train.csv'}:1:", "label"]


def bad_jsonl_line(root: Path):
    rows = [json.dumps({"text": "a fine film", "label": "positive"})] * 2 + ["{'text': 'single quotes'}"]
    (root / "train.jsonl").write_text("\n".join(rows) + "\n")
    write_jsonl(root / "val.jsonl", text_rows(3, 2))
    return [f"{root / 'train.jsonl'}:3:", "JSON"]


def bad_text_val_label(root: Path):
    write_csv(root / "train.csv", text_rows(6, 1))
    rows = text_rows(3, 2)
    rows[1]["label"] = "sarcastic"  # line 3 of val.csv (line 1 is the header)
    write_csv(root / "val.csv", rows)
    return [f"{root / 'val.csv'}:3:", "'sarcastic'"]


def bad_conll_one_column(root: Path):
    lines = conll_text(3, 1).splitlines()
    lines[4] = "lonelytoken"
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    (root / "val.txt").write_text(conll_text(2, 2))
    return [f"{root / 'train.txt'}:5:", "lonelytoken"]


def bad_conll_tag(root: Path):
    lines = conll_text(3, 1).splitlines()
    lines[3] = "Zurich NNP L-LOC"  # BILOU, not BIO
    (root / "train.txt").write_text("\n".join(lines) + "\n")
    (root / "val.txt").write_text(conll_text(2, 2))
    return [f"{root / 'train.txt'}:4:", "'L-LOC'"]


def bad_conll_val_tag(root: Path):
    (root / "train.txt").write_text("Alice NNP B-PER\nsmiled VBD O\n")
    (root / "val.txt").write_text("-DOCSTART- -X- O\n\nRome NNP B-LOC\n")
    return [f"{root / 'val.txt'}:3:", "'B-LOC'"]


def bad_not_an_image(root: Path):
    write_image_folder(root, {"train": 2, "val": 1}, size=8)
    (root / "train" / "green" / "broken.png").write_text("this is text, not a PNG\n")
    return [str(root / "train" / "green" / "broken.png"), "not a readable image"]


def bad_val_class(root: Path):
    write_image_folder(root, {"train": 2, "val": 1}, size=8)
    (root / "val" / "red").rename(root / "val" / "zebra")
    return [str(root / "val" / "zebra"), "'zebra'"]


BAD_DATA = {
    "missing-val-csv": (TEXT, bad_missing_val),
    "csv-without-label-column": (TEXT, bad_csv_without_label),
    "jsonl-line-not-json": (TEXT, bad_jsonl_line),
    "text-val-label-not-in-train": (TEXT, bad_text_val_label),
    "conll-one-column": (TOKENS, bad_conll_one_column),
    "conll-bad-tag": (TOKENS, bad_conll_tag),
    "conll-val-tag-not-in-train": (TOKENS, bad_conll_val_tag),
    "file-not-an-image": (IMAGE, bad_not_an_image),
    "image-val-class-not-in-train": (IMAGE, bad_val_class),
}
REAL_PROCESS_CASES = ["csv-without-label-column", "conll-bad-tag", "file-not-an-image"]

# --- training runs -----------------------------------------------------------------------------

# Token loss normalisation: 40 synthetic sentences of 2 to 42 words, tiny model, dropout 0 (the
# forward pass is deterministic). 4 x 4 micro-batches per update = windows of 16, 16, 8 sentences
# per epoch, the same sentences per update as batches of 16.
TOKEN_ACCUM = ["--synthetic-train-size", "40", "--synthetic-val-size", "16", "--embed-dim", "16",
               "--num-layers", "1", "--num-heads", "2", "--dropout", "0", "--lr", "0.01",
               "--warmup-steps", "2", "--epochs", "2", "--log-every", "1", "--device", "cpu"]
SMALL_TEXT = ["--embed-dim", "32", "--num-layers", "1", "--num-heads", "2", "--batch-size", "8",
              "--epochs", "10", "--lr", "1e-2", "--warmup-steps", "2", "--log-every", "1"]


def mean_of_means_copy(project: Path, dest: Path) -> Path:
    """A copy of a token grad-accum project whose loop divides each micro-batch by its own token
    count and the window length (the averaged-means trap), to show the comparison can fail."""
    dest.mkdir()
    for name in ("train.py", "data.py", "model.py"):
        (dest / name).write_text((project / name).read_text())
    code = (dest / "train.py").read_text()
    code, n = re.subn(r"/ denominator\b", "/ (loss_count(batch, loss_args) * len(window))", code)
    assert n == 1, "the token loss division changed shape; update this test"
    (dest / "train.py").write_text(code)
    return dest


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tasks")
    projects = {task: render_project(tmp / task, task) for task in TASKS}
    accum = render_project(tmp / "tokens-accum", TOKENS, ["grad-accum"])
    broken = mean_of_means_copy(accum, tmp / "tokens-accum-broken")
    data = {
        "image": write_image_folder(tmp / "images", {"train": 8, "val": 4}),
        "csv": tmp / "csv",
        "jsonl": tmp / "jsonl",
        "conll": tmp / "conll",
    }
    for name in ("csv", "jsonl", "conll"):
        data[name].mkdir()
    write_csv(data["csv"] / "train.csv", text_rows(60, 1))
    write_csv(data["csv"] / "val.csv", text_rows(30, 2))
    write_jsonl(data["jsonl"] / "train.jsonl", text_rows(60, 3))
    write_jsonl(data["jsonl"] / "val.jsonl", text_rows(30, 4))
    (data["conll"] / "train.txt").write_text(conll_text(60, 5))
    (data["conll"] / "val.txt").write_text(conll_text(30, 6))
    bad = {}
    for name, (task, writer) in BAD_DATA.items():
        (tmp / "bad" / name).mkdir(parents=True)
        bad[name] = (task, tmp / "bad" / name, writer(tmp / "bad" / name))

    out = {name: tmp / "out" / name for name in (
        "default-image", "default-text", "default-tokens", "disk-image", "disk-csv", "disk-jsonl",
        "disk-conll", "resnet18", "accum-4x4", "accum-1x16", "accum-broken", *BAD_DATA)}
    jobs = {
        # defaults: only --out-dir, as a user runs `python train.py`
        "default-image": (projects[IMAGE], []),
        "default-text": (projects[TEXT], []),
        "default-tokens": (projects[TOKENS], []),
        "disk-image": (projects[IMAGE], ["--data-dir", str(data["image"]), "--batch-size", "8",
                                         "--epochs", "4", "--lr", "3e-3", "--log-every", "1"]),
        "disk-csv": (projects[TEXT], ["--data-dir", str(data["csv"]), *SMALL_TEXT]),
        "disk-jsonl": (projects[TEXT], ["--data-dir", str(data["jsonl"]), *SMALL_TEXT]),
        "disk-conll": (projects[TOKENS], ["--data-dir", str(data["conll"]), *SMALL_TEXT]),
        "resnet18": (projects[IMAGE], ["--arch", "resnet18", "--image-size", "32", "--batch-size", "8",
                                       "--synthetic-train-size", "16", "--synthetic-val-size", "8",
                                       "--max-steps", "1", "--log-every", "1"]),
        "accum-4x4": (accum, [*TOKEN_ACCUM, "--batch-size", "4", "--grad-accum-steps", "4"]),
        "accum-1x16": (accum, [*TOKEN_ACCUM, "--batch-size", "16", "--grad-accum-steps", "1"]),
        "accum-broken": (broken, [*TOKEN_ACCUM, "--batch-size", "4", "--grad-accum-steps", "4"]),
        **{name: (projects[task], ["--data-dir", str(root)]) for name, (task, root, _) in bad.items()},
    }
    torch_home = tmp / "torch-home"  # a download of weights would land here
    torch_home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCH_HOME", str(torch_home))
        mp.setenv("OMP_NUM_THREADS", "1")
        # the real processes run while the runner trains
        real = {name: subprocess.Popen([sys.executable, "train.py", "--data-dir", str(bad[name][1]),
                                        "--out-dir", str(tmp / "out" / f"real-{name}")],
                                       cwd=projects[bad[name][0]], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
                for name in REAL_PROCESS_CASES}
        results = run_jobs([{"project": project, "args": [*args, "--out-dir", str(out[name])]}
                            for name, (project, args) in jobs.items()], tmp, timeout=1500)
        real_results = {name: (*proc.communicate(timeout=600), proc.returncode) for name, proc in real.items()}
    return {"tmp": tmp, "out": out, "data": data, "bad": bad, "torch_home": torch_home,
            "results": dict(zip(jobs, results)), "real": real_results}


def ok(runs, name) -> dict:
    result = runs["results"][name]
    assert result["ok"], f"{name}: exit {result['exit_code']}\n{result['error']}\n{result['stdout']}"
    return result["metrics"]


def final_checkpoint(out_dir: Path) -> dict:
    import torch

    return torch.load(Path(out_dir) / "final.pt", map_location="cpu", weights_only=True)


def metric_rows(out_dir: Path) -> list[dict]:
    with open(Path(out_dir) / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def max_relative_difference(a: dict, b: dict) -> float:
    """Largest per-tensor ||a - b|| / ||b|| over the float tensors of two state dicts. The key
    third of attention's in_proj_bias is left out: softmax ignores a constant added to every key,
    so its true gradient is 0 and it moves only by float noise, which Adam scales up to lr-sized
    steps (the same exclusion as tests/test_ddp.py)."""
    assert a.keys() == b.keys()
    worst = 0.0
    for name, tensor in b.items():
        other = a[name]
        if name.endswith("self_attn.in_proj_bias"):
            tensor, other = (torch_cat_without_middle_third(t) for t in (tensor, other))
        diff = (other.double() - tensor.double()).norm()
        worst = max(worst, float(diff / tensor.double().norm().clamp(min=1e-30)))
    return worst


def torch_cat_without_middle_third(tensor):
    import torch

    query, _key, value = tensor.chunk(3)
    return torch.cat([query, value])


@pytest.mark.slow
@pytest.mark.parametrize("task", list(TASKS))
def test_defaults_reach_the_stated_quality_on_built_in_data(runs, task):
    name = {IMAGE: "default-image", TEXT: "default-text", TOKENS: "default-tokens"}[task]
    metrics = ok(runs, name)
    metric, threshold = THRESHOLDS[task]
    assert metrics[metric] >= threshold, (task, metrics)
    config = json.loads((runs["out"][name] / "config.json").read_text())
    assert config["data_dir"] == "" and config["epochs"] == len(
        [r for r in metric_rows(runs["out"][name]) if r["val_loss"]])


@pytest.mark.slow
def test_image_folder_of_png_and_jpeg_files_trains(runs):
    metrics = ok(runs, "disk-image")
    assert math.isfinite(metrics["val_loss"])
    checkpoint = final_checkpoint(runs["out"]["disk-image"])
    assert checkpoint["data"] == {"classes": ["blue", "green", "red"], "class_weights": None}
    assert checkpoint["model"]["head.weight"].shape[0] == 3
    # 3 classes x 8 training images (notes.txt skipped), batches of 8: 3 updates per epoch
    rows = metric_rows(runs["out"]["disk-image"])
    assert [int(r["step"]) for r in rows if r["val_loss"]] == [3, 6, 9, 12]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["disk-csv", "disk-jsonl"])
def test_text_csv_and_jsonl_train(runs, name):
    metrics = ok(runs, name)
    assert metrics["val_acc"] >= 0.8, metrics  # 3 classes with unmistakable words; chance 0.33
    data = final_checkpoint(runs["out"][name])["data"]
    assert data["classes"] == ["negative", "neutral", "positive"]
    assert data["vocab"][:2] == ["<pad>", "<unk>"]
    split = {"disk-csv": "train.csv", "disk-jsonl": "train.jsonl"}[name]
    with open(runs["data"][name.removeprefix("disk-")] / split, encoding="utf-8-sig") as f:
        raw = f.read().lower()
    assert all(word in raw for word in data["vocab"][2:])  # every word comes from the training split


@pytest.mark.slow
def test_conll_file_trains_and_tags_come_from_the_data(runs):
    metrics = ok(runs, "disk-conll")
    assert {"val_acc", "val_f1"} <= metrics.keys()
    data = final_checkpoint(runs["out"]["disk-conll"])["data"]
    train_text = (runs["data"]["conll"] / "train.txt").read_text()
    assert data["tags"] == ["O"] + sorted(conll_tags(train_text) - {"O"})
    assert "-docstart-" not in data["vocab"] and "NNP" not in data["vocab"] and "nnp" not in data["vocab"]
    assert final_checkpoint(runs["out"]["disk-conll"])["model"]["head.weight"].shape[0] == len(data["tags"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BAD_DATA))
def test_bad_data_stops_with_one_line_naming_the_file(runs, name):
    result = runs["results"][name]
    message = result["error"]
    assert not result["ok"] and result["exit_code"] == 1, result
    assert message.startswith("error: ") and "\n" not in message.strip(), message
    for needle in runs["bad"][name][2]:
        assert needle in message, (needle, message)


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_PROCESS_CASES)
def test_bad_data_as_a_real_process_prints_one_line_and_no_traceback(runs, name):
    _stdout, stderr, returncode = runs["real"][name]
    assert returncode != 0
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("error: ") and all(needle in stderr for needle in runs["bad"][name][2])


@pytest.mark.slow
def test_token_loss_over_the_window_k_times_b_equals_one_batch(runs):
    """PITFALLS.md section 2: sum of token losses / real tokens of the whole window."""
    for name in ("accum-4x4", "accum-1x16", "accum-broken"):
        ok(runs, name)
    accumulated, one_batch, broken = (final_checkpoint(runs["out"][n])["model"]
                                      for n in ("accum-4x4", "accum-1x16", "accum-broken"))
    assert max_relative_difference(accumulated, one_batch) <= 1e-5
    losses = [[float(r["train_loss"]) for r in metric_rows(runs["out"][n]) if r["train_loss"]]
              for n in ("accum-4x4", "accum-1x16")]
    assert len(losses[0]) == len(losses[1]) == 6  # 3 updates per epoch, 2 epochs
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    # the comparison can fail: averaging per-micro-batch means ends far away
    assert max_relative_difference(broken, one_batch) > 1e-3


@pytest.mark.slow
def test_resnet18_random_weights_no_download_one_step(runs):
    ok(runs, "resnet18")
    checkpoint = final_checkpoint(runs["out"]["resnet18"])
    assert checkpoint["step"] == 1 and checkpoint["config"]["arch"] == "resnet18"
    assert checkpoint["model"]["fc.weight"].shape == (4, 512)  # resnet18's head, 4 built-in classes
    assert not any(runs["torch_home"].rglob("*")), "weights were downloaded"
