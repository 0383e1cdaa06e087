"""Do the generated projects' from-scratch defaults hold up on small real data?

Builds two real labelled data sets from what is on this machine (no download), trains the
generated minimal project of the task on each with its defaults (only --data-dir and --epochs
given), and prints its validation accuracy beside a scikit-learn baseline on the same split:

- digits: scikit-learn's bundled UCI digits (1,797 8x8 images, 10 classes) written as PNG files
  in ImageFolder layout, 80/20 stratified split (1,437 train); baseline: logistic regression on
  the raw pixels.
- docstrings: the first paragraph of the docstrings of public functions and classes of 13
  installed libraries (numpy, torch, sklearn, ...: real English text), the library as the label,
  200 texts per library, 80/20 stratified split; baseline: TF-IDF (word 1-2-grams) + logistic
  regression.

    python benchmarks/small_data.py [--epochs 10] [--only digits|docstrings] [--seeds 1]

Accuracy is not a timing: the numbers do not depend on the machine's load, only on the seed.
"""

from __future__ import annotations

import argparse
import ast
import csv
import importlib.util
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import render_project  # noqa: E402

LIBRARIES = [
    "numpy",
    "torch",
    "sklearn",
    "scipy",
    "matplotlib",
    "transformers",
    "mlflow",
    "wandb",
    "sqlalchemy",
    "jinja2",
    "pandas",
    "sympy",
    "networkx",
]
PER_LIBRARY = 200


def build_digits(root: Path, seed: int) -> tuple[Path, float]:
    """sklearn's digits as DATA/{train,val}/<digit>/*.png; returns (DATA, baseline accuracy)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_train, x_val, y_train, y_val = train_test_split(
        digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=seed
    )
    data = root / "digits"
    for split, images, labels in (("train", x_train, y_train), ("val", x_val, y_val)):
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = data / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            pixels = (image * (255 / 16)).round().astype(np.uint8)  # values 0..16
            Image.fromarray(pixels, mode="L").convert("RGB").save(folder / f"{i:04d}.png")
    baseline = LogisticRegression(max_iter=5000).fit(x_train.reshape(len(x_train), -1), y_train)
    return data, baseline.score(x_val.reshape(len(x_val), -1), y_val)


def docstrings(library: str) -> list[str]:
    """First paragraphs (>= 8 words) of the docstrings of public defs and classes, read with ast."""
    spec = importlib.util.find_spec(library)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: {library} is not installed: pip install {library}")
    texts = []
    for path in sorted(Path(spec.submodule_search_locations[0]).rglob("*.py")):
        if "test" in path.name or "tests" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node) or ""
                paragraph = " ".join(doc.strip().split("\n\n")[0].split())
                if len(paragraph.split()) >= 8:
                    texts.append(paragraph[:1000])
    return sorted(set(texts))


def build_docstrings(root: Path, seed: int) -> tuple[Path, float]:
    """DATA/{train,val}.csv with text,label; returns (DATA, TF-IDF + logistic regression accuracy)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    texts, labels = [], []
    for library in LIBRARIES:
        found = docstrings(library)
        if len(found) < PER_LIBRARY:
            sys.exit(f"error: only {len(found)} docstrings in {library}; need {PER_LIBRARY}")
        chosen = random.Random(f"{seed}-{library}").sample(found, PER_LIBRARY)
        texts += chosen
        labels += [library] * len(chosen)
    x_train, x_val, y_train, y_val = train_test_split(
        texts, labels, test_size=0.2, stratify=labels, random_state=seed
    )
    data = root / "docstrings"
    data.mkdir(parents=True)
    for split, xs, ys in (("train", x_train, y_train), ("val", x_val, y_val)):
        with open(data / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(zip(xs, ys))
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    baseline = LogisticRegression(max_iter=5000, C=10.0)
    baseline.fit(vectorizer.fit_transform(x_train), y_train)
    return data, baseline.score(vectorizer.transform(x_val), y_val)


def train_accuracy(
    project: Path, data: Path, out: Path, epochs: int, seed: int, extra: list[str]
) -> float:
    """Train the project with its defaults; the best val_acc it logged."""
    command = [
        sys.executable,
        "train.py",
        "--data-dir",
        str(data),
        "--epochs",
        str(epochs),
        "--seed",
        str(seed),
        "--out-dir",
        str(out),
        "--device",
        "cpu",
        *extra,
    ]
    done = subprocess.run(command, cwd=project, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    with open(out / "metrics.csv", newline="") as f:
        return max(float(row["val_acc"]) for row in csv.DictReader(f) if row.get("val_acc"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=1, help="train with seeds 0..N-1; print each")
    parser.add_argument("--only", choices=["digits", "docstrings"])
    parser.add_argument(
        "extra", nargs="*", help="more train.py flags after --, e.g. -- --augment none"
    )
    args = parser.parse_args()
    tasks = {
        "digits": ("image-classification", build_digits),
        "docstrings": ("text-classification", build_docstrings),
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="small-data-") as tmp:
        root = Path(tmp)
        for name, (task, build) in tasks.items():
            if args.only and name != args.only:
                continue
            data, baseline = build(root / "data", seed=0)
            project = render_project(root / "projects", task, features=[], task=task)
            accuracies = [
                train_accuracy(
                    project, data, root / "runs" / f"{name}-{seed}", args.epochs, seed, args.extra
                )
                for seed in range(args.seeds)
            ]
            rows.append((name, task, accuracies, baseline))
    print(
        f"| data set | generated project ({args.epochs} epochs, defaults) | scikit-learn baseline |"
    )
    print("|---|---|---|")
    baselines = {
        "digits": "logistic regression on pixels",
        "docstrings": "TF-IDF 1-2-grams + logistic regression",
    }
    for name, task, accuracies, baseline in rows:
        shown = " / ".join(f"{a:.3f}" for a in accuracies)
        print(f"| {name} ({task}) | val_acc {shown} | {baseline:.3f} ({baselines[name]}) |")


if __name__ == "__main__":
    main()
