"""The core templates' numbers of issue 39: lines, Jinja control lines (their share), `if`/`elif`
conditions, the longest line and the lines over 100 characters; and the feature folders.

    python benchmarks/template_numbers.py             # the working tree
    python benchmarks/template_numbers.py --at 66e350c  # the templates of a commit (git)

Prints a markdown table; judges nothing (the targets: at most 10% control lines, no line over 100).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONTROL = re.compile(r"\s*(\{%.*%\}|\{#.*|.*#\}|\{%-?\s*\w+.*)\s*")
CONDITION = re.compile(r"\{%-?\s*(?:if|elif)\b")
CORE = ("train.py.jinja", "README.md.jinja", "data.py.jinja", "model.py.jinja")


def numbers(path: Path) -> str:
    lines = path.read_text().splitlines()
    control = sum(bool(CONTROL.fullmatch(line)) for line in lines)
    conditions = sum(len(CONDITION.findall(line)) for line in lines)
    longest = max(map(len, lines))
    over = sum(len(line) > 100 for line in lines)
    share = 100 * control / len(lines)
    cells = [path.name, len(lines), f"{control} ({share:.0f}%)", conditions, longest, over]
    return "| " + " | ".join(map(str, cells)) + " |"


def templates_at(commit: str, dest: Path) -> Path:
    """`git archive COMMIT templates` unpacked into dest; the templates folder."""
    data = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "templates"], check=True, capture_output=True
    ).stdout
    tarfile.open(fileobj=BytesIO(data)).extractall(dest, filter="data")
    return dest / "templates"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--at", help="a commit whose templates to measure (default: the working tree)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = REPO / "templates"
        if args.at:
            root = templates_at(args.at, Path(tmp))
        print(f"templates of {args.at or 'the working tree'}\n")
        print(
            "| core template | lines | Jinja control lines | if/elif | longest line | lines > 100 |"
        )
        print("|---|---|---|---|---|---|")
        for name in CORE:
            print(numbers(root / "project" / name))
        features = sorted(p for p in (root / "features").glob("*") if p.is_dir())
        blocks = sum(1 for f in features for _ in (f / "blocks").rglob("*.jinja"))
        files = sum(1 for f in features for p in (f / "files").rglob("*") if p.is_file())
        print(f"\n{len(features)} feature folders, {blocks} blocks, {files} files")
        tasks = sorted(p for p in (root / "tasks").glob("*") if p.is_dir())
        if tasks:
            blocks = sum(1 for t in tasks for _ in (t / "blocks").rglob("*.jinja"))
            names = ", ".join(t.name for t in tasks)
            print(f"{len(tasks)} task folders ({names}), {blocks} blocks")


if __name__ == "__main__":
    main()
