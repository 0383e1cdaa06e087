"""Feature `pretrained` (issue 16), proven offline by running generated code on tiny models.

No model hub is reachable here: `tiny_models.py` builds a 2-layer BERT with a WordPiece tokenizer, a
RoBERTa-style byte-level BPE model and timm's `test_resnet` weights, once per session, and the
generated projects load them exactly as they would load a download (`from_pretrained(folder)`,
`timm.create_model(..., pretrained=True)` with a local file).

- sub-word alignment on hand-checked sentences (WordPiece and BPE with add_prefix_space);
- a backbone first trained on the built-in data, then fine-tuned for one epoch, beats the same
  architecture from random weights; on that run, the word-level predictions of the exported model
  give seqeval's entity F1, which equals the `val_f1` train.py reported;
- each `<task>-pretrained` snapshot's own test_pretrained.py passes (pretrained weights loaded
  tensor for tensor, only the head new; a frozen backbone stays put; the exported model gives the
  same logits without the project's code);
- the errors a user can cause stop the run before training, one line each;
- the CLI never imports timm or transformers.
amp, grad-accum (token-normalised), ddp, resume and compile with `pretrained` are checked by the
generated suite of `token-classification-pretrained-all` (test_generated_suite.py runs it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tiny_models
from conftest import REPO, render_project, run_jobs
from scaffold.examples import ROOT

pytestmark = pytest.mark.slow

TEXT, TOKENS, IMAGE = "text-classification", "token-classification", "image-classification"
SMALL = ["--synthetic-train-size", "400", "--synthetic-val-size", "100", "--batch-size", "16", "--log-every", "100"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        "bert": tiny_models.bert(root / "bert"),
        "roberta": tiny_models.roberta(root / "roberta"),
        "timm": tiny_models.timm_weights(root / "test_resnet.safetensors"),
        "gpt2": tiny_models.gpt2(root / "gpt2"),
        "llama": tiny_models.llama(root / "llama"),
    }


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained-projects")
    return {task: render_project(root / task, task, ["pretrained"]) for task in (TEXT, TOKENS, IMAGE)}


def import_generated(project: Path, name: str):
    """A generated module, imported under its own name from the project folder. The project's
    modules it imports in turn (`from data import ...`) leave sys.modules again: another project's
    model.py must find its own data.py, not this one's."""
    before = set(sys.modules)
    sys.path.insert(0, str(project))
    try:
        spec = importlib.util.spec_from_file_location(f"generated_{name}_{project.name}", project / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(project))
        for other in set(sys.modules) - before:
            if str(getattr(sys.modules[other], "__file__", None) or "").startswith(str(project)):
                del sys.modules[other]


# --- sub-word alignment, hand-checked -----------------------------------------------------------

TAGS = ["O", "B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER"]
WORDS = ["Grace", "Hopper", "visited", "Cape", "Town", "yesterday"]
WORD_TAGS = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]
X = None  # an ignored position (-100)
# Worked by hand from tiny_models.FIXED_WORDPIECE / FIXED_MERGES (the pieces are checked too).
EXPECTED = {
    "wordpiece": (
        ["[CLS]", "gra", "##ce", "ho", "##pp", "##er", "vis", "##ited", "cape", "town", "yes", "##ter", "##day",
         "[SEP]"],
        [X, "B-PER", X, "I-PER", X, X, "O", X, "B-LOC", "I-LOC", "O", X, X, X],
        [X, "B-PER", "I-PER", "I-PER", "I-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O", "O", "O", X],
    ),
    # byte-level BPE with add_prefix_space=True: each word starts with the space marker Ġ; with
    # few merges most words fall apart into single letters
    "bpe": (
        ["<s>", *"ĠGrace", *"ĠHopper", "Ġvis", "ited", *"ĠCape", *"ĠTown", "Ġy", "es", *"terday", "</s>"],
        [X, "B-PER", *[X] * 5, "I-PER", *[X] * 6, "O", X, "B-LOC", *[X] * 4, "I-LOC", *[X] * 4, "O", *[X] * 7, X],
        [X, "B-PER", *["I-PER"] * 12, "O", "O", "B-LOC", *["I-LOC"] * 9, *["O"] * 8, X],
    ),
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_sub_word_alignment_on_a_hand_checked_sentence(projects, tiny, tmp_path, kind):
    data = import_generated(projects[TOKENS], "data")
    if kind == "wordpiece":
        folder = tiny_models.fixed_wordpiece(tmp_path / kind, tiny["bert"])
    else:
        folder = tiny_models.fixed_bpe(tmp_path / kind, tiny["roberta"])
    cfg = type("Cfg", (), {"model": str(folder)})()
    tokenizer = data.load_tokenizer(cfg)
    pieces, first_only, all_subwords = EXPECTED[kind]
    for label_all, expected in ((False, first_only), (True, all_subwords)):
        [encoded] = data.encode([(WORDS, WORD_TAGS, 1)], tokenizer, TAGS, 128, "hand", label_all)
        assert tokenizer.convert_ids_to_tokens(encoded["input_ids"]) == pieces
        got = [X if t == -100 else TAGS[t] for t in encoded["labels"]]
        assert got == expected, (kind, label_all)


# --- pretrained beats random; word-level F1 equals seqeval's -------------------------------------


@pytest.fixture(scope="module")
def fine_tuning(projects, tiny, tmp_path_factory):
    """Pretrain the tiny BERT on the built-in token data (4 epochs), keep its backbone only (a
    base model: the head must be new), then fine-tune it and the random BERT for 1 epoch each."""
    root = tmp_path_factory.mktemp("fine-tuning")
    project = projects[TOKENS]
    pretrain = {"project": project, "args": [*SMALL, "--model", str(tiny["bert"]), "--lr", "3e-3", "--epochs", "4",
                                              "--synthetic-train-size", "800", "--out-dir", str(root / "pretrain")]}
    [result] = run_jobs([pretrain], root)
    assert result["ok"], result["error"] + result["stdout"]
    from transformers import AutoModel, AutoTokenizer

    backbone = root / "pretrained-backbone"
    AutoModel.from_pretrained(root / "pretrain" / "model").save_pretrained(backbone)
    AutoTokenizer.from_pretrained(root / "pretrain" / "model").save_pretrained(backbone)
    jobs = [
        {"project": project, "args": [*SMALL, "--model", str(model), "--lr", "3e-3", "--epochs", "1",
                                      "--out-dir", str(root / name)]}
        for name, model in (("from-pretrained", backbone), ("from-random", tiny["bert"]))
    ]
    results = run_jobs(jobs, root)
    for result in results:
        assert result["ok"], result["error"] + result["stdout"]
    return root, {"from-pretrained": results[0]["metrics"], "from-random": results[1]["metrics"]}


def test_fine_tuning_a_pretrained_backbone_beats_random_weights_after_one_epoch(fine_tuning):
    _, metrics = fine_tuning
    pretrained, random = metrics["from-pretrained"], metrics["from-random"]
    assert pretrained["val_f1"] > random["val_f1"] + 0.1, (pretrained, random)
    assert pretrained["val_loss"] < random["val_loss"], (pretrained, random)


def test_word_level_entity_f1_equals_seqeval(projects, fine_tuning):
    """Predict every validation sentence with the exported model alone, map the sub-word
    predictions back to words (the first sub-word of each), and score with seqeval."""
    import torch
    from seqeval.metrics import f1_score
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    root, metrics = fine_tuning
    data = import_generated(projects[TOKENS], "data")
    folder = root / "from-pretrained" / "model"
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    gold, predicted = [], []
    for words, tags, _ in data.synthetic_sentences(100, 2):  # train.py's validation sentences
        tokens = tokenizer(words, is_split_into_words=True, truncation=True, max_length=128, return_tensors="pt")
        with torch.no_grad():
            ids = model(**tokens).logits[0].argmax(-1).tolist()
        word_ids = tokens.word_ids()
        first = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
        assert len(first) == len(words)
        predicted.append([model.config.id2label[ids[i]] for i in first])
        gold.append(tags)
    f1 = f1_score(gold, predicted)
    assert f1 > 0.2, "too few entities found for a meaningful comparison"
    assert f1 == pytest.approx(metrics["from-pretrained"]["val_f1"], abs=1e-6)


# --- each <task>-pretrained snapshot's own test_pretrained.py ------------------------------------


def test_snapshot_test_pretrained_passes(tmp_path):
    """Weights loaded tensor for tensor with only the head new, a frozen backbone that stays put,
    and an export that gives the same logits, for the three tasks (their generated tests)."""
    procs = {}
    for task in (TEXT, TOKENS, IMAGE):
        copy = shutil.copytree(ROOT / f"{task}-pretrained", tmp_path / task)
        procs[task] = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_pretrained.py"],
            cwd=copy, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
    for task, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{task}:\n{out[-3000:]}"
        assert "3 passed" in out, out[-500:]


# --- decoder-only backbones (GPT-2, Llama): no padding token of their own ---------------------

TEXTS = ["goal", "the team won the match in the last minute of the season",
         "bread and garlic soup", "a flight to tokyo"]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_decoder_only_backbones_classify_padded_batches(projects, tiny, tmp_path, kind):
    """Issue 29, item 3: text classification fine-tunes a GPT-2 or Llama (tokenizers without a
    padding token) with batches of 8 padded texts; each text's logits in a padded batch are its
    logits alone (the mask and the last-real-token pooling are right); the exported folder gives
    the same logits on the same padded batch with transformers alone."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    project = projects[TEXT]
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "train.py", *SMALL[:4], "--batch-size", "8", "--epochs", "1",
                           "--model", str(tiny[kind]), "--device", "cpu", "--out-dir", str(run)],
                          cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_py, data_py = import_generated(project, "model"), import_generated(project, "data")
    model, cfg, data_info = model_py.load_trained(run / "final.pt", torch.device("cpu"))
    tokenizer = data_py.load_tokenizer(cfg)
    encoded = [tokenizer(text)["input_ids"] for text in TEXTS]
    padded = tokenizer.pad({"input_ids": encoded}, return_tensors="pt")
    assert (padded["attention_mask"] == 0).any(), "the batch needs padding"
    with torch.no_grad():
        batch_logits = model(padded["input_ids"])
        alone = torch.cat([model(torch.tensor([ids])) for ids in encoded])
        assert (batch_logits - alone).abs().max().item() < 1e-5
        exported = AutoModelForSequenceClassification.from_pretrained(run / "model").eval()
        hf_tokenizer = AutoTokenizer.from_pretrained(run / "model")
        inputs = hf_tokenizer(TEXTS, padding=True, return_tensors="pt")
        assert torch.equal(inputs["input_ids"], padded["input_ids"])
        assert (exported(**inputs).logits - batch_logits).abs().max().item() < 1e-5


# --- pretrained + fsdp: fine-tuned sharded on 2 ranks, exported whole ---------------------------

# appended to the copy's data.py: records, at every optimizer step of each rank, what the rank
# stores of the parameters (DTensor local shards) and each parameter group's lr. Changes no number.
FSDP_HOOK = """

import json as _json
import os as _os

from torch.optim.optimizer import register_optimizer_step_pre_hook as _register_step_hook

_RECORD = _os.environ.get("PRETRAINED_FSDP_RECORD")
_steps = []


def _record_step(optimizer, args, kwargs):
    params = [p for group in optimizer.param_groups for p in group["params"]]
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
    full = sum(p.numel() for p in params)
    _steps.append({"local": local, "full": full, "lrs": [g["lr"] for g in optimizer.param_groups]})
    Path(f"{_RECORD}.rank{_os.environ.get('RANK', '0')}.json").write_text(_json.dumps(_steps))


if _RECORD:
    _register_step_hook(_record_step)
"""


def test_fsdp_fine_tunes_sharded_and_exports_the_whole_model(tiny, tmp_path):
    """token-classification-pretrained-fsdp under a real torchrun (2 gloo ranks): the tiny BERT is
    sharded per transformer layer (each rank stores about half of the parameters), bf16 mixed
    precision with activation checkpointing runs, the backbone group (of sharded parameters) learns
    nothing in the frozen epoch and at --backbone-lr-scale after it, and rank 0 exports
    <out-dir>/model/ from the gathered final.pt: loaded with transformers alone, it gives final.pt's
    logits."""
    import torch
    from test_ddp import torchrun, wait_ok

    project = shutil.copytree(ROOT / "token-classification-pretrained-fsdp", tmp_path / "project")
    with open(project / "data.py", "a") as f:
        f.write(FSDP_HOOK)
    out, record = tmp_path / "out", tmp_path / "steps"
    args = ["--model", str(tiny["bert"]), "--device", "cpu", "--synthetic-train-size", "64",
            "--synthetic-val-size", "16", "--batch-size", "8", "--grad-accum-steps", "2", "--epochs", "2",
            "--lr", "1e-3", "--backbone-lr-scale", "0.5", "--freeze-backbone-epochs", "1",
            "--precision", "bf16", "--activation-checkpointing", "--log-every", "1", "--out-dir", str(out)]
    log = wait_ok(torchrun(project, args, tmp_path / "torchrun.log", PRETRAINED_FSDP_RECORD=record), "2 ranks")
    assert log.count("done: 4 updates") == 2, log[-3000:]

    steps = {rank: json.loads(Path(f"{record}.rank{rank}.json").read_text()) for rank in (0, 1)}
    full = steps[0][0]["full"]
    assert steps[0][0]["local"] + steps[1][0]["local"] == full
    for rank in (0, 1):
        assert 0.4 < steps[rank][0]["local"] / full < 0.6, steps[rank][0]
        # the groups: the head's decayed and spared parameters, then the backbone's
        head, head_spared, backbone, backbone_spared = zip(*(step["lrs"] for step in steps[rank]))
        assert head == head_spared and backbone == backbone_spared, steps[rank]
        assert all(lr > 0 for lr in head) and backbone[:2] == (0.0, 0.0), steps[rank]  # frozen epoch
        assert backbone[2] == pytest.approx(0.5 * head[2]), steps[rank]

    from transformers import AutoModelForTokenClassification

    model = import_generated(project, "model")
    sys.path.insert(0, str(project))  # model.py imports data
    try:
        trained, _, data_info = model.load_trained(out / "final.pt", torch.device("cpu"))
    finally:
        sys.path.remove(str(project))
    exported = AutoModelForTokenClassification.from_pretrained(out / "model").eval()
    ids = torch.tensor([[2, 17, 31, 44, 5, 3]])
    with torch.no_grad():
        logits = exported(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        assert torch.equal(logits, trained(ids))


# --- errors before training, one line each ------------------------------------------------------


def test_bad_models_stop_before_training_with_one_line(projects, tiny, tmp_path, monkeypatch):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub is unreachable here anyway: fail fast
    models = tmp_path / "models"  # (not in an --out-dir: train.py writes config.json there)
    (models / "empty").mkdir(parents=True)
    mismatch = models / "mismatch"  # BERT's weights (vocabulary 200) with RoBERTa's tokenizer (320)
    shutil.copytree(tiny["roberta"], mismatch)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny["bert"] / name, mismatch / name)
    headed = models / "two-label-head"  # a head already fine-tuned for two labels
    AutoModelForSequenceClassification.from_pretrained(
        tiny["bert"], id2label={0: "food", 1: "sports"}, label2id={"food": 0, "sports": 1}
    ).save_pretrained(headed)
    AutoTokenizer.from_pretrained(tiny["bert"]).save_pretrained(headed)
    cases = {
        "hub": (TEXT, ["--model", "no-such-org/no-such-model"], ["cannot load", "save_pretrained"]),
        "missing": (TOKENS, ["--model", str(models / "missing")], ["no such directory"]),
        "not-a-model": (TEXT, ["--model", str(models / "empty")], ["no saved model", "config.json"]),
        "mismatch": (TOKENS, ["--model", str(mismatch)], ["tokenizer", "another model"]),
        "head": (TEXT, ["--model", str(headed)], ["trained for 2 labels", "science", "base model"]),
        "timm-name": (IMAGE, ["--model", "no_such_net"], ["not a timm model", "list_models"]),
        "timm-weights": (IMAGE, ["--model", "test_resnet", "--weights", str(tiny["bert"] / "model.safetensors")],
                         ["cannot load its weights", "--weights"]),
    }
    jobs = [{"project": projects[task], "args": [*SMALL, *args, "--out-dir", str(tmp_path / name)]}
            for name, (task, args, _) in cases.items()]
    for (name, (_, _, words)), result in zip(cases.items(), run_jobs(jobs, tmp_path)):
        message = result["error"]
        assert not result["ok"] and message.startswith("error: "), (name, result)
        assert "\n" not in message and "Traceback" not in message, (name, message)
        assert all(w in message for w in words), (name, message)
        assert not (tmp_path / name / "metrics.csv").exists(), name
    missing = subprocess.run(
        [sys.executable, "train.py", "--weights", str(tmp_path / "nowhere.safetensors")],
        cwd=projects[IMAGE], capture_output=True, text=True, timeout=120,
    )
    assert missing.returncode == 2 and "--weights" in missing.stderr and "no such file" in missing.stderr


def test_cli_never_imports_timm_or_transformers(tmp_path):
    code = (
        "import runpy, sys\n"
        "sys.argv = ['scaffold', 'new', sys.argv[1], '--task', 'token-classification', '-f', 'pretrained']\n"
        "try:\n    runpy.run_module('scaffold', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print(sorted(m for m in ('timm', 'transformers', 'tokenizers') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "p")], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr
    assert (tmp_path / "p" / "tests" / "test_pretrained.py").is_file()


def test_add_and_remove_feature_pretrained_in_an_existing_project(tmp_path):
    """`scaffold add feature pretrained` gives the files `new -f pretrained` gives; remove undoes
    it. (Into a model.py the user edited it is a conflict: pretrained replaces that model.)"""
    from conftest import scaffold_cli

    def sources(folder: Path) -> dict:
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
                if p.is_file() and ".scaffold" not in p.parts}

    project, fresh = tmp_path / "p", tmp_path / "fresh" / "p"
    fresh.parent.mkdir()
    for args in ((str(project),), (str(fresh), "-f", "pretrained")):
        made = scaffold_cli("new", *args, "--task", "token-classification")
        assert made.returncode == 0, made.stderr
    before = sources(project)
    added = scaffold_cli("add", "feature", "pretrained", "--project", str(project))
    assert added.returncode == 0, added.stdout + added.stderr
    assert {k: v for k, v in sources(project).items() if "backup" not in k} == sources(fresh)
    removed = scaffold_cli("remove", "feature", "pretrained", "--project", str(project))
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert {k: v for k, v in sources(project).items() if "backup" not in k} == before
