"""Two on-disk caches that make the second render of a template fast without changing a byte.

- `black`: black's output per input file (black is deterministic for a version and mode).
- `jinja`: the Python code Jinja compiles from each template (copier compiles about 200 small
  templates per render: file names, question defaults and the files themselves).

They live in $SCAFFOLD_CACHE_DIR/KIND, else $XDG_CACHE_HOME/scaffold/KIND, else
~/.cache/scaffold/KIND; SCAFFOLD_CACHE_DIR="" turns them off. Every entry starts with a line
holding the sha256 of the rest, so a damaged entry is a miss, never a wrong answer. jinja2 is
imported only inside `jinja_code_cache`, so `scaffold --help` stays fast.
"""

from __future__ import annotations

import functools
import hashlib
import marshal
import os
import sys
import types
from contextlib import contextmanager
from pathlib import Path


@functools.cache
def cache_dir(kind: str) -> Path | None:
    """The folder of cache KIND, created on first use; None when caching is off or impossible."""
    configured = os.environ.get("SCAFFOLD_CACHE_DIR")
    if configured == "":
        return None
    if configured:
        folder = Path(configured) / kind
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        folder = Path(base) / "scaffold" / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder


def key(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def load(kind: str, name: str) -> bytes | None:
    """The entry NAME of cache KIND, or None if it is missing, damaged or caching is off."""
    folder = cache_dir(kind)
    if folder is None:
        return None
    try:
        digest, _, data = (folder / name).read_bytes().partition(b"\n")
    except OSError:
        return None
    return data if digest == hashlib.sha256(data).hexdigest().encode() else None


def store(kind: str, name: str, data: bytes) -> None:
    """Atomic (a reader sees the old entry, the new one, or none); a failure is only a miss."""
    folder = cache_dir(kind)
    if folder is None:
        return
    path = folder / name
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(hashlib.sha256(data).hexdigest().encode() + b"\n" + data)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written is no cache, not an error


@contextmanager
def jinja_code_cache():
    """Keep the Python code Jinja compiles from templates on disk, as Python keeps .pyc files.

    The code Jinja generates depends only on the template source, its name and file name, the
    environment's syntax options and the jinja2 and Python versions, so those are the key. Only
    `jinja2.Environment.compile` is wrapped, and only inside this block.
    """
    import jinja2

    if cache_dir("jinja") is None:
        yield
        return
    original = jinja2.Environment.compile

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
        if raw or not isinstance(source, str):
            return original(self, source, name, filename, raw, defer_init)
        options = (
            jinja2.__version__,
            sys.version,
            type(self).__qualname__,
            self.block_start_string,
            self.block_end_string,
            self.variable_start_string,
            self.variable_end_string,
            self.comment_start_string,
            self.comment_end_string,
            self.line_statement_prefix,
            self.line_comment_prefix,
            self.trim_blocks,
            self.lstrip_blocks,
            self.newline_sequence,
            self.keep_trailing_newline,
            self.optimized,
            self.is_async,
            repr(self.autoescape),
            tuple(sorted(self.extensions)),
            name,
            filename,
            defer_init,
        )
        entry = key(repr(options).encode(), source.encode()) + ".code"
        data = load("jinja", entry)
        if data is not None:
            try:
                code = marshal.loads(data)
                if isinstance(code, types.CodeType):
                    return code
            except (ValueError, EOFError, TypeError):
                pass  # unreadable: compile again
        code = original(self, source, name, filename, raw, defer_init)
        store("jinja", entry, marshal.dumps(code))
        return code

    jinja2.Environment.compile = compile
    try:
        yield
    finally:
        jinja2.Environment.compile = original
