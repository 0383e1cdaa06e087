"""The user's formatting, so that a formatting-only difference is never an edit.

scaffold renders black at 88 columns. A team that runs `black -l 100 .`, `ruff format` with its
own line length, sorts imports its own way (ruff's isort rules) or indents with tabs would see every
re-wrapped statement near a feature block as an edit. So, before the three-way merge, the base and
the new render are brought into the user's form (`Style.apply`), and the merged file comes out
formatted the user's way.

Where the style comes from:
- the project's `pyproject.toml`: `[tool.black] line-length / skip-string-normalization`,
  `[tool.ruff] line-length`, `[tool.ruff.format]`, `[tool.ruff.lint.isort]` / `[tool.isort]`
  (ruff formats and sorts when it is installed; black otherwise);
- else the files: tab indentation, and a line length (100, 120) when black at that length
  reproduces more of the user's `train.py` than scaffold's 88 columns do.

`merge_text` applies the style to a file only when that makes the base closer to the user's file,
so a file the user never reformatted merges exactly as before.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scaffold import cache

DEFAULT_LINE_LENGTH = 88
CANDIDATE_LINE_LENGTHS = (100, 120, 79)


@dataclass
class Style:
    project: Path
    line_length: int = DEFAULT_LINE_LENGTH
    string_normalization: bool = True
    ruff_format: bool = False  # `ruff format` with the project's settings
    ruff_isort: bool = False  # `ruff check --select I --fix` with the project's settings
    tabs: bool = False
    _cache: dict = field(default_factory=dict, repr=False)

    def apply(self, text: str, rel: str = "file.py") -> str:
        key = (rel, text)
        if key not in self._cache:
            self._cache[key] = self._apply(text, rel)
        return self._cache[key]

    def _apply(self, text: str, rel: str) -> str:
        out = text
        if self.ruff_format:
            out = _ruff(self.project, rel, out, "format") or out
        elif self.line_length != DEFAULT_LINE_LENGTH or not self.string_normalization:
            out = _black(out, self.line_length, self.string_normalization)
        if self.ruff_isort:
            out = _ruff(self.project, rel, out, "isort") or out
        if self.tabs:
            out = to_tabs(out)
        return out

    def __bool__(self) -> bool:
        return (
            self.line_length != DEFAULT_LINE_LENGTH
            or not self.string_normalization
            or self.ruff_format
            or self.ruff_isort
            or self.tabs
        )


def to_tabs(text: str) -> str:
    """Leading spaces as tabs, four to a tab (what `unexpand --first-only -t 4` does)."""
    lines = []
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip(" ")
        n = len(line) - len(stripped)
        lines.append("\t" * (n // 4) + " " * (n % 4) + stripped)
    return "".join(lines)


def _black(text: str, line_length: int, string_normalization: bool) -> str:
    """black's output in this mode, kept in the black cache (scaffold.cache) as render's is."""
    from importlib.metadata import version

    options = f"{version('black')} {line_length} {string_normalization}".encode()
    entry = cache.key(b"style", options, text.encode()) + ".py"
    cached = cache.load("black", entry)
    if cached is not None:
        return cached.decode()
    import black

    mode = black.Mode(line_length=line_length, string_normalization=string_normalization)
    try:
        formatted = black.format_str(text, mode=mode)
    except Exception:  # black refuses what it cannot parse: keep the text as it is
        return text
    cache.store("black", entry, formatted.encode())
    return formatted


def _ruff_command() -> list[str] | None:
    exe = shutil.which("ruff")
    if exe:
        return [exe]
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    return None


def _ruff(project: Path, rel: str, text: str, what: str) -> str | None:
    command = _ruff_command()
    if command is None:
        return None
    if what == "format":
        args = ["format", "--no-cache", "--stdin-filename", rel, "-"]
    else:
        args = [
            "check",
            "--no-cache",
            "--select",
            "I",
            "--fix",
            "--exit-zero",
            "--quiet",
            "--stdin-filename",
            rel,
            "-",
        ]
    try:
        proc = subprocess.run(
            [*command, *args], cwd=project, input=text.encode(), capture_output=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 or not proc.stdout:
        return None
    return proc.stdout.decode()


def _settings(project: Path) -> dict:
    import tomllib

    try:
        with open(project / "pyproject.toml", "rb") as f:
            return tomllib.load(f).get("tool", {})
    except (OSError, ValueError):
        return {}


def similarity(a: str, b: str) -> float:
    """Lines in common, in order, over all lines: 1.0 for the same text, 0.0 for nothing shared."""
    import difflib

    return difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False).ratio()


def detect(project: Path, base_files: dict[str, bytes]) -> Style | None:
    """How the project's Python files are formatted, or None when it is scaffold's own form."""
    project = Path(project)
    tool = _settings(project)
    style = Style(project)
    black_cfg, ruff_cfg = tool.get("black", {}), tool.get("ruff", {})
    if isinstance(black_cfg, dict) and black_cfg:
        style.line_length = int(black_cfg.get("line-length", DEFAULT_LINE_LENGTH))
        style.string_normalization = not black_cfg.get("skip-string-normalization", False)
    ruff_ok = _ruff_command() is not None
    if isinstance(ruff_cfg, dict) and ruff_cfg:
        if "line-length" in ruff_cfg:
            style.line_length = int(ruff_cfg["line-length"])
        if ruff_ok and not black_cfg and (ruff_cfg.get("format") or "line-length" in ruff_cfg):
            style.ruff_format = True
        lint = ruff_cfg.get("lint", {})
        if ruff_ok and (ruff_cfg.get("isort") or (isinstance(lint, dict) and lint.get("isort"))):
            style.ruff_isort = True
    elif ruff_ok and tool.get("isort"):
        style.ruff_isort = True

    # what the files say
    yours = {}
    for rel in base_files:
        if rel.endswith(".py"):
            try:
                yours[rel] = (project / rel).read_bytes().decode("utf-8", "replace")
            except OSError:
                continue
    indented = [
        line for text in yours.values() for line in text.splitlines() if line[:1] in (" ", "\t")
    ]
    if indented and sum(line.startswith("\t") for line in indented) > len(indented) / 2:
        style.tabs = True
    main = "train.py" if "train.py" in yours else next(iter(yours), None)
    configured = bool(black_cfg) or "line-length" in ruff_cfg
    if main and not configured and main in base_files:
        mine = yours[main].replace("\r\n", "\n")
        if style.tabs:
            mine = mine.replace("\t", "    ")
        lengths = [len(line) for line in mine.splitlines()]
        # a formatter at another length leaves many long lines (or none near 88), a hand edit a few
        wider = sum(n > DEFAULT_LINE_LENGTH for n in lengths) >= 3
        if wider or max(lengths, default=0) < DEFAULT_LINE_LENGTH - 12:
            base = base_files[main].decode("utf-8", "replace")
            best, best_score = DEFAULT_LINE_LENGTH, similarity(base, mine)
            for length in CANDIDATE_LINE_LENGTHS:
                score = similarity(_black(base, length, True), mine)
                if score > best_score:
                    best, best_score = length, score
            style.line_length = best
    return style if style else None
