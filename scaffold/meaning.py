"""A merge checked for meaning, not only syntax.

Two checks on a merged Python file, both plain functions of texts (no project, no disk), so that
`add/remove feature` and a future `upgrade` share them:

- `introduced_problems`: pyflakes' undefined-name class of errors that the merged file has and the
  user's own file did not (a name the user renamed, a name the change removed that a user line still
  reads), each with its line and a likely cause ("uses `optimizer`; your code calls it `opt`").
- `find_leftovers`: after a feature is removed, each line still tagged `# [feature]`, and each line
  that reads a name or a Config field only that feature defined.
"""

from __future__ import annotations

import ast
import difflib
import io
import re
import tokenize
from collections import Counter
from dataclasses import dataclass, field

# pyflakes messages that mean "this file fails at run time": the ones a merge can introduce.
SERIOUS = ("UndefinedName", "UndefinedLocal", "UndefinedExport")


@dataclass
class Gone:
    """What a change takes away: features (their `# [name]` tags), names and Config fields."""

    features: tuple[str, ...] = ()
    names: dict[str, str] = field(default_factory=dict)  # name -> who defined it ("feature 'amp'")
    fields: dict[str, str] = field(default_factory=dict)  # Config field -> who defined it

    def __bool__(self) -> bool:
        return bool(self.features or self.names or self.fields)


def _parse(text: str):
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def undefined(text: str) -> list[tuple[int, str, str]]:
    """(line, name, kind) per pyflakes undefined-name error in `text` ([] if it does not parse)."""
    from pyflakes.checker import Checker

    tree = _parse(text)
    if tree is None:
        return []
    found = []
    for message in Checker(tree, filename="<merged>").messages:
        kind = type(message).__name__
        if kind in SERIOUS:
            found.append((message.lineno, str(message.message_args[0]), kind))
    return sorted(found)


def bound_names(text: str) -> set[str]:
    """Every name `text` binds anywhere: assignments, defs, classes, imports, arguments."""
    tree = _parse(text)
    names: set[str] = set()
    if tree is None:
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def config_fields(text: str) -> set[str]:
    """The fields of the `Config` dataclass in `text`."""
    tree = _parse(text)
    fields: set[str] = set()
    if tree is None:
        return fields
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields.add(item.target.id)
    return fields


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


def name_tokens(text: str) -> set[str]:
    return {t.string for t in _tokens(text) if t.type == tokenize.NAME}


def gone_between(base: str, theirs: str, who: str) -> Gone:
    """Names and Config fields that `base` defines and `theirs` no longer mentions at all."""
    left = name_tokens(theirs)
    names = {n: who for n in bound_names(base) - left if not n.startswith("__")}
    fields = {f: who for f in config_fields(base) - config_fields(theirs)}
    return Gone(names=names, fields=fields)


def find_leftovers(path: str, text: str, gone: Gone, yours: str = "", base: str = "") -> list[str]:
    """Lines of `text` that still carry what `gone` took away, one message per line.

    A name the user binds on a line of their own (not in `base`) is theirs, not a leftover.
    """
    if not gone:
        return []
    base_lines = {line.strip() for line in base.splitlines()}
    own = set()
    if yours:
        own_lines = "\n".join(line for line in yours.splitlines() if line.strip() not in base_lines)
        own = {
            n
            for n in gone.names
            if re.search(rf"\b{re.escape(n)}\b\s*(=|:|\bin\b)|def {n}\b", own_lines)
        }
    tag = (
        re.compile(r"\[(" + "|".join(map(re.escape, gone.features)) + r")\]")
        if gone.features
        else None
    )
    found: dict[int, str] = {}
    tokens = _tokens(text)
    previous = None
    for token in tokens:
        line = token.start[0]
        if line in found:
            previous = token
            continue
        if token.type == tokenize.COMMENT and tag is not None:
            match = tag.search(token.string)
            if match:
                found[line] = (
                    f"{path}:{line}: a line tagged [{match.group(1)}] is still here, "
                    f"but feature {match.group(1)!r} is removed: delete it"
                )
        elif token.type == tokenize.NAME:
            attribute = (
                previous is not None and previous.type == tokenize.OP and previous.string == "."
            )
            if attribute and token.string in gone.fields:
                found[line] = (
                    f"{path}:{line}: reads Config field `{token.string}`, which "
                    f"{gone.fields[token.string]} defined and this change removes: "
                    "delete or rewrite the line"
                )
            elif not attribute and token.string in gone.names and token.string not in own:
                found[line] = (
                    f"{path}:{line}: uses `{token.string}`, which "
                    f"{gone.names[token.string]} defined and this change removes: "
                    "delete or rewrite the line"
                )
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token
    return [found[line] for line in sorted(found)]


def rename_hint(name: str, base: str, yours: str) -> str | None:
    """The name the user's edit gave to `name` (defined in `base`, gone from `yours`), if any.

    Lines the user changed are paired with the base lines they replace; where `name` stood in a
    base line, the word at the same place in the user's line is a vote.
    """
    if name not in bound_names(base) or name in name_tokens(yours):
        return None
    base_names = name_tokens(base)
    a, b = base.splitlines(), yours.splitlines()
    votes: Counter = Counter()
    word = re.compile(r"\w+|[^\w\s]")
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "replace":
            continue
        for old, new in zip(a[i1:i2], b[j1:j2]):
            old_words, new_words = word.findall(old), word.findall(new)
            if len(old_words) != len(new_words):
                continue
            for x, y in zip(old_words, new_words):
                if x == name and y != x and y.isidentifier() and y not in base_names:
                    votes[y] += 1
    return votes.most_common(1)[0][0] if votes else None


def introduced_problems(
    path: str,
    merged: str,
    yours: str,
    base: str,
    theirs: str,
    gone: Gone | None = None,
    skip_lines=(),
) -> list[str]:
    """Undefined names in `merged` that neither the user's file nor the new render had."""
    had = {(name, kind) for _, name, kind in undefined(yours)}
    had |= {(name, kind) for _, name, kind in undefined(theirs)}
    problems = []
    seen = set()
    for line, name, kind in undefined(merged):
        if (name, kind) in had or line in skip_lines or (line, name) in seen:
            continue
        seen.add((line, name))
        renamed = rename_hint(name, base, yours)
        if renamed:
            why = f"your code calls it `{renamed}`: use one name (rename it here, or back)"
        elif gone is not None and name in gone.names:
            why = (
                f"which {gone.names[name]} defined and this change removes: "
                "delete or rewrite the line"
            )
        elif name in bound_names(base) and name not in bound_names(merged):
            why = "which the merged file no longer defines: define it, or rewrite the line"
        else:
            why = "which is not defined in the merged file: define it, or rewrite the line"
        if kind == "UndefinedLocal":
            why = "before it is assigned in this function: " + why
        problems.append(f"{path}:{line} uses `{name}`; {why}")
    return problems
