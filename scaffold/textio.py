"""Text is text: read a file in its own encoding and line endings, write it back the same way.

A file merges as text when git would (no NUL byte) and Python can decode it: in the encoding its
PEP 263 coding line names (`# -*- coding: cp1252 -*-`), else UTF-8, else cp1252, else latin-1
(which decodes every byte). The merge works on LF text; `encode` gives the result the file's own
encoding, byte-order mark, final-newline choice and line endings back, line by line: a line that
comes from the user's file keeps the ending it had there (a CRLF file with a few LF lines stays
so), a new line gets the file's most common ending.
"""

from __future__ import annotations

import codecs
import difflib
import io
import re
import tokenize
from dataclasses import dataclass, field

_COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


@dataclass
class Text:
    """A decoded file: LF-normalised `text` and what it takes to write it back byte for byte."""

    text: str  # "\n" line endings; ends with "\n" unless the file was empty
    encoding: str
    bom: bytes = b""
    endings: list[str] = field(default_factory=list)  # each line's own ending ("\n", "\r\n", "\r")
    final_newline: bool = True

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    @property
    def newline(self) -> str:
        """The most common line ending (LF for a file without line breaks)."""
        if not self.endings:
            return "\n"
        return max(("\n", "\r\n", "\r"), key=self.endings.count)


def cookie_encoding(data: bytes) -> str | None:
    """The encoding a PEP 263 coding line in the first two lines names, if any (and valid)."""
    for line in data.split(b"\n", 2)[:2]:
        match = _COOKIE.match(line)
        if match:
            try:
                return codecs.lookup(match.group(1).decode("ascii")).name
            except (LookupError, UnicodeDecodeError):
                return None
        if line.strip() and not line.lstrip().startswith(b"#"):
            break
    return None


def decode(data: bytes, python: bool = False) -> Text | None:
    """The file as text, or None when it is binary (a NUL byte, as git decides) or undecodable."""
    if b"\0" in data:
        return None
    bom = b""
    encoding = cookie_encoding(data) if python else None
    if python and encoding is None:
        try:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        except SyntaxError:
            encoding = None
    if data.startswith(codecs.BOM_UTF8):
        bom, data, encoding = codecs.BOM_UTF8, data[len(codecs.BOM_UTF8) :], "utf-8"
    candidates = [encoding] if encoding and encoding != "utf-8-sig" else []
    candidates += ["utf-8", "cp1252", "latin-1"]
    for name in candidates:
        try:
            text = data.decode(name)
        except (UnicodeDecodeError, LookupError):
            continue
        return _split(text, name if name != "utf-8-sig" else "utf-8", bom)
    return None  # not reached: latin-1 decodes every byte


def _split(raw: str, encoding: str, bom: bytes) -> Text:
    parts = re.split(r"(\r\n|\n|\r)", raw)
    lines, endings = parts[0::2], parts[1::2]
    final_newline = raw == "" or lines[-1] == ""
    if lines and lines[-1] == "":
        lines.pop()
    text = "".join(line + "\n" for line in lines)
    return Text(text, encoding, bom, endings, final_newline)


def encode(text: str, like: Text) -> bytes:
    """`text` (LF) written the way `like` was: encoding, BOM, per-line endings, final newline.

    Raises UnicodeEncodeError when `text` holds a character the encoding cannot store.
    """
    new = text.splitlines(keepends=True)
    old = like.lines
    endings = [like.newline] * len(new)
    if any(e != "\n" for e in like.endings):
        matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for k in range(i2 - i1):
                    if i1 + k < len(like.endings):
                        endings[j1 + k] = like.endings[i1 + k]
    out = []
    for line, ending in zip(new, endings):
        out.append(line[:-1] + ending if line.endswith("\n") else line)
    result = "".join(out)
    if not like.final_newline and new and result.endswith(endings[-1]):
        result = result[: -len(endings[-1])]
    return like.bom + result.encode(like.encoding)
