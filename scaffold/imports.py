"""The import block of a generated module, sorted as isort (and ruff's `I` rule) sorts it.

A feature's imports are lines in its folder (`blocks/FILE/imports.jinja`), not branches in the
core template: the renderer puts every block at its point, then `sort_imports` puts each import
where isort would. Sections, one blank line apart: `__future__`, the standard library, third
party, the project's own modules (every `.py` file of the project; `from conftest import ...`
in tests). In a section, `import x` lines first, then `from x import ...`, each by module name.
Two `from` imports of one module become one (`from torch.utils.data import DataLoader` and a
feature's `from torch.utils.data import DistributedSampler  # [ddp]`): the names as isort
orders them (CONSTANTS, Classes, functions), the comments' feature tags joined in order.

Only the module's first run of top-level imports is sorted, and only when nothing but blank
lines lies between them (a comment or code in between: the block is left as written). A
statement that is not merged keeps its text byte for byte.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize

STDLIB = frozenset(sys.stdlib_module_names) | {"tomllib"}  # the same sections on 3.10
LINE_LENGTH = 88  # black's
_TAG = re.compile(r"\[[^\]]+\]")


def sort_imports(text: str, first_party: set[str]) -> str:
    """`text` with its first block of top-level imports sorted (see the module docstring)."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return text  # black reports it
    run = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            run.append(node)
        elif run:
            break
    if not run:
        return text
    lines = text.splitlines(keepends=True)
    first, last = run[0].lineno - 1, run[-1].end_lineno
    covered = {i for node in run for i in range(node.lineno - 1, node.end_lineno)}
    if any(lines[i].strip() for i in range(first, last) if i not in covered):
        return text  # a comment or code between the imports
    if any(lines[node.lineno - 1][: node.col_offset].strip() for node in run):
        return text  # `import a; import b` on one line
    sections: dict[int, list] = {}
    merged: dict[tuple, list] = {}
    for node in run:
        source = "".join(lines[node.lineno - 1 : node.end_lineno])
        if isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            # isort keeps `from x import a as b` apart, after `from x import c`
            aliased = any(alias.asname for alias in node.names)
            key = (_section(module, first_party), 1, module, aliased)
        elif isinstance(node, ast.Import):
            module = node.names[0].name
            key = (_section(module, first_party), 0, module, False)
        else:  # relative imports: the project's own
            key = (3, 1, "." * node.level + (node.module or ""), False)
        merged.setdefault(key, []).append((node, source))
    for key in sorted(merged, key=lambda k: (k[0], k[1], k[2].lower(), k[2], k[3])):
        sections.setdefault(key[0], []).append(_one_statement(key, merged[key]))
    block = "\n".join("".join(statements) for _, statements in sorted(sections.items()))
    return "".join(lines[:first]) + block + "".join(lines[last:])


def _section(module: str, first_party: set[str]) -> int:
    top = module.split(".")[0]
    if top == "__future__":
        return 0
    if top in first_party:
        return 3
    return 1 if top in STDLIB else 2


def _one_statement(key: tuple, statements: list) -> str:
    """One statement for all of `statements` (imports of one module)."""
    texts = list(dict.fromkeys(source for _, source in statements))
    if len(texts) == 1 or key[1] == 0 or key[3]:
        return "".join(texts)  # one statement, or ones isort keeps apart
    names = {}
    for node, _ in statements:
        for alias in node.names:
            text = alias.name + (f" as {alias.asname}" if alias.asname else "")
            names[text] = alias.name
    ordered = sorted(names, key=lambda text: _name_key(names[text]))
    comment = _joined_comment([source for _, source in statements])
    head = f"from {key[2]} import "
    one_line = head + ", ".join(ordered) + comment
    if len(one_line) <= LINE_LENGTH:
        return one_line + "\n"
    return head + "(" + comment + "\n" + "".join(f"    {n},\n" for n in ordered) + ")\n"


def _name_key(name: str) -> tuple:
    """isort's order_by_type: CONSTANTS, then Classes, then everything else."""
    if name.isupper() and len(name) > 1:
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return kind, name.lower(), name


def _joined_comment(sources: list[str]) -> str:
    """The statements' comments as one: feature tags in order of appearance, without repeats;
    any other comment text kept once."""
    tags, others = [], []
    for source in sources:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            text = token.string.lstrip("#").strip()
            found = _TAG.findall(text)
            if found and not _TAG.sub("", text).strip():
                tags += found
            elif text:
                others.append(text)
    parts = [" ".join(dict.fromkeys(tags))] if tags else []
    parts += list(dict.fromkeys(others))
    return "  # " + "  # ".join(parts) if parts else ""
