"""scaffold/imports.py: a generated module's imports sorted as isort (ruff's `I` rule) sorts them,
so that a feature's imports live in its folder (`blocks/train.py/imports.jinja`) and land where
isort puts them.

- Every snapshot's import blocks (checked by ruff's `I` rule in test_examples.py), shuffled and
  with every `from M import a, b` split into one statement per name (each with the statement's
  comment), come back byte for byte: sections, order and the joined statements are isort's.
- Hand-worked cases: a feature's names joined to the core's statement with its tag; tags of
  two features joined in order; `import a as b` kept apart; a block with a comment in it left
  as written.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from scaffold.examples import ROOT
from scaffold.imports import sort_imports

SNAPSHOT_FILES = sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def own_modules(path: Path) -> set[str]:
    project = ROOT / path.relative_to(ROOT).parts[0]
    return {p.stem for p in project.rglob("*.py")}


def scrambled(text: str, seed: int) -> str | None:
    """`text` with its first import block shuffled and its `from` imports split by name."""
    body = ast.parse(text).body
    run = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            run.append(node)
        elif run:
            break
    if len(run) < 2:
        return None
    lines = text.splitlines(keepends=True)
    statements = []
    for node in run:
        source = "".join(lines[node.lineno - 1 : node.end_lineno])
        comment = source[source.index("#") :].split("\n")[0] if "#" in source else ""
        # (a joined statement that opens up carries its comment after "(", as the fsdp one
        # in the templates does; one black wrapped, with the comment after ")", stays whole)
        joinable = not any(a.asname for a in node.names) and not source.rstrip().split("\n")[-1].startswith(")  #")
        if isinstance(node, ast.ImportFrom) and len(node.names) > 1 and joinable:
            comment = "  " + comment if comment else ""
            statements += [f"from {node.module} import {a.name}{comment}\n" for a in node.names]
        else:
            statements.append(source)
    random.Random(seed).shuffle(statements)
    return "".join(lines[: run[0].lineno - 1]) + "".join(statements) + "".join(lines[run[-1].end_lineno :])


@pytest.mark.parametrize("path", SNAPSHOT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_snapshot_imports_come_back_from_any_order(path):
    text = path.read_text()
    for seed in range(3):
        shuffled = scrambled(text, seed)
        if shuffled is None:
            return
        assert sort_imports(shuffled, own_modules(path)) == text


CORE = """\"\"\"A module.\"\"\"

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

import data


def main():
    pass
"""


def test_a_features_names_join_the_core_statement_with_its_tag():
    text = CORE.replace("import data\n", "import data\nimport signal  # [resume]\n")
    text = text.replace("from tqdm", "from torch.utils.data import Subset  # [ddp]\nfrom tqdm")
    text = text.replace("import data\n", "import data\nfrom torch.utils.data import DistributedSampler  # [ddp]\n")
    expected = CORE.replace("import os\n", "import os\nimport signal  # [resume]\n")
    expected = expected.replace(
        "import DataLoader\n", "import DataLoader, DistributedSampler, Subset  # [ddp]\n"
    )
    assert sort_imports(text, {"data"}) == expected


def test_two_features_tags_join_in_order_and_a_long_statement_opens_up():
    text = CORE.replace(
        "import data\n",
        "import data\nfrom torch.distributed.checkpoint.state_dict import StateDictOptions  # [fsdp]\n"
        "from torch.distributed.checkpoint.state_dict import get_model_state_dict  # [fsdp]\n"
        "from torch.distributed.checkpoint.state_dict import get_state_dict  # [fsdp] [resume]\n",
    )
    expected = CORE.replace(
        "import torch\n",
        "import torch\nfrom torch.distributed.checkpoint.state_dict import (  # [fsdp] [resume]\n"
        "    StateDictOptions,\n    get_model_state_dict,\n    get_state_dict,\n)\n",
    )
    assert sort_imports(text, {"data"}) == expected


def test_an_aliased_import_stays_apart_and_the_own_modules_come_last():
    text = CORE.replace("from tqdm import tqdm\n", "from tqdm import tqdm\nfrom torch.utils.data import default_collate as dc\n")
    text = text.replace("import os\n", "import os\nimport callbacks as cb  # [callbacks]\n")
    expected = CORE.replace(
        "import DataLoader\n", "import DataLoader\nfrom torch.utils.data import default_collate as dc\n"
    ).replace("import data\n", "import callbacks as cb  # [callbacks]\nimport data\n")
    assert sort_imports(text, {"data", "callbacks"}) == expected


def test_a_block_with_a_comment_in_it_is_left_as_written():
    text = CORE.replace("import os\n", "import os\n# the paths\n").replace("import os\n", "import sys\nimport os\n")
    assert sort_imports(text, {"data"}) == text
