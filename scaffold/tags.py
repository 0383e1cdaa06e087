"""Which lines of a generated file belong to which feature: the tag convention.

Every line a feature adds to (or changes in) a generated file is covered by one of these
(README.md, "How the template is organised", documents them for users):

- any line that contains the tag `[NAME]` is NAME's (a comment, a docstring line, a
  Markdown line, a requirements line);
- Python: a comment line that starts with `# [NAME]` covers the lines below it down to the
  first blank line that is followed by a line at most as indented as the comment, or to
  the first line indented less than the comment (the end of its block);
- Python: a tag in a comment at the end of a statement covers that whole statement (all of
  its physical lines; for a compound statement, its header: `for ...:`, `if ...:`);
- Python: a function or class whose docstring starts with `[NAME]` is NAME's, and so is a
  whole file whose module docstring starts with `[NAME]`;
- shell: a script whose first comment starts with `# [NAME]` is NAME's; a comment line
  `# [NAME] ...` covers the lines below it down to the next blank line;
- Markdown: a list item whose first line holds `[NAME]` is NAME's down to its last
  (indented) continuation line.

A line can belong to several features (a line that exists only when two features are both
chosen carries both tags). `feature_lines(path, text)` returns {feature: {line numbers}}.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

# [amp], or [LAYER:FEATURE] for a team layer's feature (scaffold/layers.py)
TAG = re.compile(r"\[([a-z][a-z0-9-]*(?::[a-z][a-z0-9-]*)?)\]")
LEADING_TAGS = re.compile(r"^\s*((?:\[[a-z][a-z0-9-]*(?::[a-z][a-z0-9-]*)?\]\s*)+)")


def _leading_tags(text: str) -> list[str]:
    match = LEADING_TAGS.match(text)
    return TAG.findall(match.group(1)) if match else []


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def feature_lines(path: str, text: str) -> dict[str, set[int]]:
    """{feature: line numbers (1-based)} for the file `path` (its name decides the rules)."""
    lines = text.splitlines()
    covered: dict[str, set[int]] = {}

    def add(names, first: int, last: int) -> None:
        for name in names:
            covered.setdefault(name, set()).update(range(first, last + 1))

    for number, line in enumerate(lines, 1):
        add(TAG.findall(line), number, number)
    if path.endswith(".py"):
        _python(text, lines, add)
    elif path.endswith(".md"):
        _markdown(lines, add)
    elif path.endswith(".sh"):
        comments = [line for line in lines if line.startswith("#") and not line.startswith("#!")]
        if comments:
            add(_leading_tags(comments[0].lstrip("#")), 1, len(lines))
        for number, line in enumerate(lines, 1):
            names = (
                _leading_tags(line.lstrip().lstrip("#")) if line.lstrip().startswith("#") else []
            )
            if names:  # a tag comment line: down to the next blank line
                last = next(
                    (n - 1 for n in range(number + 1, len(lines) + 1) if not lines[n - 1].strip()),
                    len(lines),
                )
                add(names, number, last)
    return covered


def _python(text: str, lines: list[str], add) -> None:
    tree = ast.parse(text)
    doc = ast.get_docstring(tree, clean=False)
    if doc is not None:
        add(_leading_tags(doc), 1, len(lines))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                add(_leading_tags(doc), first, node.end_lineno)
    # logical lines: (first, last) physical line of each statement or header
    logical, start = {}, None
    skip = (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NEWLINE:
            if start is not None:
                for number in range(start, token.end[0] + 1):
                    logical[number] = (start, token.end[0])
            start = None
        elif start is None and token.type not in skip:
            start = token.start[0]
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type != tokenize.COMMENT:
            continue
        number = token.start[0]
        names = _leading_tags(token.string.lstrip("#"))
        if not names:
            continue
        before = lines[number - 1][: token.start[1]]
        if before.strip():  # a comment at the end of a statement: the whole statement
            first, last = logical.get(number, (number, number))
            add(names, first, last)
            continue
        # a comment line: its paragraph, down to a blank line at its level or a dedent
        indent, last = _indent(lines[number - 1]), number
        for following in range(number + 1, len(lines) + 1):
            line = lines[following - 1]
            if not line.strip():
                after = next((x for x in lines[following:] if x.strip()), None)
                if after is None or _indent(after) <= indent:
                    break
                continue
            # a dedent ends it, unless the line continues a statement begun inside
            if _indent(line) < indent and logical.get(following, (following,))[0] >= following:
                break
            last = following
        add(names, number, last)


def _markdown(lines: list[str], add) -> None:
    for number, line in enumerate(lines, 1):
        stripped = line.lstrip()
        if not stripped.startswith(("- ", "* ")):
            continue
        names = TAG.findall(line)
        if not names:
            continue
        dash, last = _indent(line), number
        for following in range(number + 1, len(lines) + 1):
            text = lines[following - 1]
            if not text.strip():
                after = next((x for x in lines[following:] if x.strip()), None)
                if after is None or _indent(after) <= dash:
                    break
                continue
            if _indent(text) <= dash:
                break
            last = following
        add(names, number, last)
