"""Team layers: a team's own features, defaults and files on top of scaffold's templates.

A layer is a directory (or a git repository at a ref, cloned into scaffold's cache) holding

    layer.toml                          name, version, supported scaffold versions, defaults,
                                        features (help, requires, conflicts, packages)
    files/PATH[.jinja]                  files every project of the layer gets (CODEOWNERS, CI)
    features/NAME/files/PATH[.jinja]    files a feature adds (its module, tests/test_*.py)
    features/NAME/blocks/FILE/POINT.jinja
                                        lines a feature puts at a named extension point of
                                        scaffold's train.py, data.py or model.py
                                        (scaffold/blocks.py: POINTS)

Nothing of a layer runs at render time: its templates are rendered by a sandboxed Jinja
environment with StrictUndefined, and syntax that could reach Python internals (attributes
starting with `_`, include/import/extends) is refused before rendering. What a template builds is
bounded (MAX_CHARS per value and per rendered file). A layer is read only through regular files
inside its root: a link is followed only when it resolves to a regular file inside the layer
(checked on the directory, and on a git layer's tree before it is extracted). A block is tagged
`# [LAYER:FEATURE]`, like scaffold's own feature blocks (scaffold/tags.py).

A project records each layer as a pin: the source as given, its name and version, and its
identity (the commit of a git layer, a content hash of a directory layer).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import posixpath
import re
import subprocess
import tarfile
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from scaffold import __version__, cache
from scaffold.blocks import Block, block_paths, paths_under, place, unknown_point
from scaffold.catalogue import FEATURES, Feature
from scaffold.errors import ScaffoldError

MANIFEST = "layer.toml"
ENV_VAR = "SCAFFOLD_LAYER"
NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,39}")
# defaults a layer may change: Config fields of train.py
DEFAULT_FIELDS = ("lr", "log_every", "epochs", "batch_size", "weight_decay", "seed", "out_dir")


@dataclass(frozen=True)
class Pin:
    """A layer as a project records it."""

    source: str
    name: str = ""
    version: str = ""
    identity: str = ""  # a git commit, or "sha256:..." of a directory's content

    def as_data(self) -> dict:
        return {
            "source": self.source,
            "name": self.name,
            "version": self.version,
            "identity": self.identity,
        }


@dataclass(frozen=True)
class Layer:
    name: str
    version: str
    source: str
    identity: str
    root: Path
    features: dict[str, Feature]
    always: tuple[str, ...] = ()
    description: str | None = None
    config: dict = field(default_factory=dict)

    @property
    def pin(self) -> Pin:
        return Pin(self.source, self.name, self.version, self.identity)

    def label(self) -> str:
        short = self.identity.removeprefix("sha256:")[:12]
        return f"{self.name} {self.version} ({self.source} @ {short})"


# --- sources: a directory, or a git repository at a ref ------------------------------------------


def is_git(source: str) -> bool:
    return source.startswith("git+") or "#" in source


def _git_parts(source: str) -> tuple[str, str]:
    url, _, ref = source.removeprefix("git+").partition("#")
    return url, ref or "HEAD"


def normalise(source: str) -> str:
    """A source as recorded: a git source as given, a directory as an absolute path."""
    if not isinstance(source, str) or not source.strip():
        raise ScaffoldError("invalid layer: give a directory or a git URL#REF")
    if is_git(source):
        return source
    return str(Path(source).expanduser().resolve())


def _git(*args: str, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScaffoldError(f"git failed ({exc}): install git, or use a layer directory") from None
    if proc.returncode:
        raise OSError((proc.stderr.strip().splitlines() or ["git failed"])[-1])
    return proc.stdout.strip()


def _layers_cache() -> Path:
    folder = cache.cache_dir("layers")
    if folder is None:
        raise ScaffoldError(
            "git layers need a cache folder: unset SCAFFOLD_CACHE_DIR='' or make ~/.cache writable"
        )
    return folder


def _repo_dir(url: str) -> Path:
    return _layers_cache() / hashlib.sha256(url.encode()).hexdigest()[:16]


def _fetch(url: str) -> Path:
    repo = _repo_dir(url) / "repo.git"
    try:
        if not repo.is_dir():
            _git("clone", "--quiet", "--bare", url, str(repo))
            (repo.parent / "url").write_text(url + "\n")
        else:
            _git(
                "fetch",
                "--quiet",
                "--prune",
                "origin",
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*",
                cwd=repo,
            )
    except OSError as exc:
        raise ScaffoldError(
            f"cannot fetch layer {url} ({exc}): check the URL and your access"
        ) from None
    return repo


def _has_commit(repo: Path, commit: str) -> bool:
    try:
        return repo.is_dir() and _git("cat-file", "-t", commit, cwd=repo) == "commit"
    except OSError:
        return False


def _checkout(url: str, repo: Path, commit: str) -> Path:
    dest = repo.parent / commit
    if (dest / MANIFEST).is_file():
        return dest
    try:
        data = subprocess.run(
            ["git", "archive", "--format=tar", commit], cwd=repo, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ScaffoldError(
            f"cannot check out layer {url} at {commit} ({exc}): delete {repo.parent} and retry"
        ) from None
    tmp = repo.parent / f".{commit}.{os.getpid()}"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        _check_members(f"{url}#{commit[:12]}", tar.getmembers())
        try:
            tar.extractall(tmp, filter="data")
        except tarfile.FilterError as exc:  # _check_members refuses these first; never silent
            raise ScaffoldError(f"layer {url}: {exc}: remove it from the layer") from None
    try:
        os.replace(tmp, dest)
    except OSError:  # another process got there first
        pass
    return dest


def _git_layer_root(source: str, commit: str | None) -> tuple[Path, str]:
    url, ref = _git_parts(source)
    repo = _repo_dir(url) / "repo.git"
    if commit is None or not _has_commit(repo, commit):
        repo = _fetch(url)
    if commit is None:
        try:
            commit = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo)
        except OSError:
            raise ScaffoldError(
                f"layer {url} has no branch, tag or commit {ref!r}: check the #REF"
            ) from None
    elif not _has_commit(repo, commit):
        raise ScaffoldError(
            f"layer {url} no longer has commit {commit[:12]}: restore it, or "
            "run 'scaffold upgrade' to move to the ref's current commit"
        )
    return _checkout(url, repo, commit), commit


def _outside(rel: str, target: str, source: str) -> ScaffoldError:
    return ScaffoldError(
        f"layer {source}: {rel} is a link to {target}, which is not a file inside the layer: "
        "a layer may only link to its own files (copy the file into the layer)"
    )


def _not_regular(rel: str, source: str) -> ScaffoldError:
    return ScaffoldError(f"layer {source}: {rel} is not a regular file: remove it from the layer")


def _check_members(source: str, members: list[tarfile.TarInfo]) -> None:
    """A git layer's tree: every link must name a file of the same tree (no absolute target,
    no `..` out of the root); anything but files, folders and such links is refused."""
    by_name = {m.name: m for m in members}
    files = {m.name for m in members if m.isfile()}
    for member in members:
        if member.issym():
            if _resolve_member(member.name, by_name) not in files:
                raise _outside(member.name, member.linkname, source)
        elif not (member.isfile() or member.isdir()):
            raise _not_regular(member.name, source)


def _resolve_member(name: str, members: dict[str, tarfile.TarInfo], depth: int = 0) -> str | None:
    """`name` after following links inside the tree (None: it leaves the tree or loops)."""
    if name.startswith("../") or name == ".." or depth > 40:
        return None
    member = members.get(name)
    if member is None or not member.issym():
        return name
    target = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
    return None if member.linkname.startswith("/") else _resolve_member(target, members, depth + 1)


def check_tree(source: str, root: Path) -> None:
    """Refuse a layer directory holding a link to anything but a regular file inside it (a file
    outside, a folder, nothing), or a special file (a fifo would block the read)."""
    base = root.resolve()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in (*dirs, *files):
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                resolved = path.resolve()
                if not (resolved.is_relative_to(base) and resolved.is_file()):
                    raise _outside(rel, os.readlink(path), source)
            elif not (path.is_dir() or path.is_file()):
                raise _not_regular(rel, source)


def content_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".git/") or "__pycache__" in path.parts:
            continue
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


# --- loading and checking -------------------------------------------------------------------------


def load(source: str, identity: str | None = None) -> Layer:
    """The layer at `source` (a git layer at commit `identity` if given, else its ref's head)."""
    if is_git(source):
        root, identity = _git_layer_root(source, identity or None)
        check_tree(source, root)
        return _load(source, root, identity)
    root = Path(normalise(source))  # a relative source (scaffold's own examples) stays relative
    if not root.is_dir():
        raise ScaffoldError(f"layer {source} is not a directory: give a layer directory or URL#REF")
    check_tree(source, root)  # before anything of it is read, the hash included
    return _load(source, root, content_hash(root))


@functools.cache
def _load(source: str, root: Path, identity: str) -> Layer:
    manifest = root / MANIFEST
    try:
        data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScaffoldError(
            f"layer {source}: no {MANIFEST}: a layer directory starts with one"
        ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ScaffoldError(
            f"layer {source}: {MANIFEST} does not parse ({exc}): fix the manifest"
        ) from None
    try:
        name, version = data["name"], str(data["version"])
        supported = data.get("scaffold", "*")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ValueError(f"name {name!r} must be lower-case letters, digits and '-'")
        defaults = data.get("defaults", {})
        always = tuple(defaults.get("features", ()))
        description = defaults.get("description")
        config = dict(defaults.get("config", {}))
        features = {}
        for fname, spec in data.get("features", {}).items():
            features[fname] = Feature(
                fname,
                str(spec["help"]),
                tuple(spec.get("requires", ())),
                tuple(spec.get("conflicts", ())),
                tuple(spec.get("packages", ())),
                layer=name,
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ScaffoldError(
            f"layer {source}: {MANIFEST} does not parse ({exc}): fix the manifest"
        ) from None
    if not _supports(str(supported)):
        raise ScaffoldError(
            f"layer {source}: {name} {version} supports scaffold {supported}, not {__version__}: "
            "use a version of the layer made for this scaffold",
        )
    for fname, feature in features.items():
        if fname in FEATURES:
            raise ScaffoldError(
                f"layer {source}: feature {fname!r} collides with scaffold's own {fname!r}: "
                "rename the layer's",
            )
        if not NAME_RE.fullmatch(fname):
            raise ScaffoldError(
                f"layer {source}: feature name {fname!r} must be lower-case letters, digits and '-'"
            )
        known = set(features) | set(FEATURES)
        for other in (*feature.requires, *feature.conflicts, *always):
            if other not in known:
                raise ScaffoldError(
                    f"layer {source}: feature {other!r} is not scaffold's nor the layer's: fix it"
                )
    for key, value in config.items():
        if key not in DEFAULT_FIELDS or not isinstance(value, (int, float, str)):
            raise ScaffoldError(
                f"layer {source}: default {key!r} cannot be set: a layer may set "
                f"{', '.join(DEFAULT_FIELDS)} to a number or string",
            )
    for fname in features:
        for target, point, path in block_paths(root / "features" / fname):
            why = unknown_point(target, point)
            if why:
                raise ScaffoldError(f"layer {source}: {path.relative_to(root)} {why}")
    for path in sorted(root.rglob("*.jinja")):
        _check_template(source, root, path)
    return Layer(name, version, source, identity, root, features, always, description, config)


def _supports(spec: str) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if spec.strip() in ("", "*"):
        return True
    try:
        return __version__ in SpecifierSet(spec)
    except InvalidSpecifier:
        return False


_UNSAFE_NODES = ("Include", "Import", "FromImport", "Extends", "Macro", "CallBlock")


# what one layer template may build: any value, and the whole rendered file (characters)
MAX_CHARS = 1_000_000
# a width or precision of a million or more: "%3000000000s", "%.3000000000f", "{:>3000000000}"
_WIDTH = re.compile(r"%[-+ #0]*(?:\d*\.)?(\d{7,})|\{[^{}]*:[^{}]*?(\d{7,})")


class TooLarge(Exception):
    """A layer template tried to build more than MAX_CHARS."""


def _size(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


def _bounded(size: int, what: str) -> None:
    if size > MAX_CHARS:
        raise TooLarge(f"{what} of {size:,} characters")


def _width(text, what: str) -> None:  # "%3000000000s" or "{:>3000000000}"
    match = _WIDTH.search(text) if isinstance(text, str) else None
    if match:
        _bounded(int(match.group(1) or match.group(2)), what)


# filters and str methods whose integer arguments are widths or counts of what they build
_SIZED = {"center", "indent", "wordwrap", "truncate", "batch", "slice"}  # filters
_SIZED |= {"ljust", "rjust", "zfill", "expandtabs"}  # str methods


def _check_sized(name: str, args, kwargs) -> None:
    if name in _SIZED:
        for value in (*args[1:], *kwargs.values()):
            if isinstance(value, int) and abs(value) > MAX_CHARS:
                _bounded(abs(value), name)


def _check_replace(text, old, new, what: str) -> None:
    if isinstance(text, str):
        _bounded(len(text) + text.count(str(old)) * len(str(new)), what)


def _bounded_filter(name: str, func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        values = args[1:] if hasattr(func, "jinja_pass_arg") else args  # a context first
        _check_sized(name, values, kwargs)
        if name == "format" and values:
            _width(values[0], "filter format")
        if name == "replace" and len(values) >= 3:
            _check_replace(values[0], values[1], values[2], "filter replace")
        result = func(*args, **kwargs)
        _bounded(_size(result), f"filter {name}")
        return result

    return wrapper


@functools.cache
def _environment_class():
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generator(CodeGenerator):
        def visit_Concat(self, node, frame):  # `a ~ b`: through the size check below
            self.write("environment.bounded_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Bounded(ImmutableSandboxedEnvironment):
        """The sandbox, with repetition, concatenation, powers, widths and filters bounded."""

        code_generator_class = Generator
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, times in ((left, right), (right, left)):
                    if _size(seq) and isinstance(times, int):
                        _bounded(_size(seq) * times, "a repetition")
            elif operator == "**" and isinstance(right, int) and abs(right) > 1000:
                raise TooLarge(f"a power with exponent {right:,}")
            elif operator == "+":
                _bounded(_size(left) + _size(right), "a concatenation")
            elif operator == "%":
                _width(left, "a format width")
            return super().call_binop(context, operator, left, right)

        def call(self, context, obj, *args, **kwargs):
            name = getattr(obj, "__name__", "")
            if isinstance(getattr(obj, "__self__", None), str):
                _check_sized(name, ("", *args), kwargs)
                if name == "replace" and len(args) >= 2:
                    _check_replace(obj.__self__, args[0], args[1], "str.replace")
            result = super().call(context, obj, *args, **kwargs)
            _bounded(_size(result), f"a call of {name or 'a function'}")
            return result

        def wrap_str_format(self, value):  # "...".format / .format_map, seen at attribute access
            _width(getattr(value, "__self__", None), "a format width")
            return super().wrap_str_format(value)

        @staticmethod
        def bounded_concat(parts):
            text = "".join(map(str, parts))
            _bounded(len(text), "concatenation")
            return text

    return Bounded


def _environment():
    from jinja2 import StrictUndefined

    env = _environment_class()(
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.globals.pop("lipsum", None)  # lipsum(n) builds n paragraphs
    return env


def _check_template(source: str, root: Path, path: Path) -> None:
    from jinja2 import TemplateSyntaxError, nodes

    rel = path.relative_to(root).as_posix()
    try:
        tree = _environment().parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, TemplateSyntaxError) as exc:
        raise ScaffoldError(
            f"layer {source}: {rel} fails to parse ({exc}): fix the template"
        ) from None
    for node in tree.find_all(nodes.Node):
        name = getattr(node, "attr", None) or getattr(node, "name", None)
        unsafe = type(node).__name__ in _UNSAFE_NODES or (
            isinstance(node, (nodes.Getattr, nodes.Name)) and str(name).startswith("_")
        )
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            unsafe = unsafe or str(node.arg.value).startswith("_")
        if unsafe:
            raise ScaffoldError(
                f"layer {source}: {rel} uses template syntax that could run code "
                f"({type(node).__name__} {name or ''}): a layer template may use variables, "
                "if and for only",
            )


# --- rendering ------------------------------------------------------------------------------------


def catalogue(layers: list[Layer]) -> dict[str, Feature]:
    """scaffold's features, then each layer's; two layers may not define the same name."""
    merged, owner = dict(FEATURES), {}
    for layer in layers:
        for fname, feature in layer.features.items():
            if fname in owner:
                raise ScaffoldError(
                    f"layers {owner[fname]!r} and {layer.name!r} both define feature {fname!r}: "
                    "use one of them, or rename the feature in one"
                )
            owner[fname] = layer.name
            merged[fname] = feature
    return merged


def _render(layer: Layer, path: Path, context: dict) -> str:
    from jinja2 import TemplateError
    from jinja2.exceptions import SecurityError

    rel = path.relative_to(layer.root).as_posix()
    try:
        template = _environment().from_string(path.read_text(encoding="utf-8"))
        chunks, size = [], 0
        for chunk in template.generate(context):  # a loop's output is bounded as it grows
            size += len(chunk)
            _bounded(size, "the rendered file")
            chunks.append(chunk)
        return "".join(chunks)
    except TooLarge as exc:
        raise ScaffoldError(
            f"layer {layer.name}: {rel} builds more than a layer template may ({exc}; at most "
            f"{MAX_CHARS:,} characters per value and per file): make it smaller"
        ) from None
    except SecurityError as exc:
        raise ScaffoldError(
            f"layer {layer.name}: {rel} uses template syntax that could run code ({exc}): remove it"
        ) from None
    except (TemplateError, TypeError, ValueError, ArithmeticError, MemoryError) as exc:
        raise ScaffoldError(
            f"layer {layer.name}: {rel} fails to render ({type(exc).__name__}: {exc})"
        ) from None


def apply(
    files: dict[str, bytes], layers: list[Layer], context: dict, own: list[Block] = ()
) -> dict[str, bytes]:
    """The rendered templates plus scaffold's own blocks (`own`, scaffold/blocks.py) and the
    layers': their blocks at the points (the point lines go), their files, their defaults."""
    features = context["features"]
    found: list[Block] = list(own)
    out = dict(files)
    for layer in layers:
        chosen = ["."] + [f"features/{f}" for f in layer.features if f in features]
        for folder in chosen:
            for path in paths_under(layer.root / folder / "files"):
                rel = path.relative_to(layer.root / folder / "files").as_posix()
                if rel.endswith(".jinja"):
                    out[rel[: -len(".jinja")]] = _render(layer, path, context).encode()
                else:
                    out[rel] = path.read_bytes()
        for fname in layer.features:
            if fname not in features:
                continue
            for target, point, path in block_paths(layer.root / "features" / fname):
                text = textwrap.dedent(_render(layer, path, context)).strip("\n")
                if not text:
                    continue
                tag = f"[{layer.name}:{fname}]"
                if tag not in text.splitlines()[0]:
                    text = f"# {tag}\n{text}"
                rel = path.relative_to(layer.root).as_posix()
                found.append(Block(target, point, text, f"{layer.name}: {rel}", padded=True))
    listed = [  # the lines that list a chosen layer feature, as scaffold's own features are
        (f"[{feature.tag}] {feature.help}")
        for layer in layers
        for feature in layer.features.values()
        if feature.name in features
    ]
    for target in ("train.py", "README.md"):
        if target in out and listed:
            out[target] = _NONE_LINES[target].sub("", out[target].decode(), count=1).encode()
            for line in listed:  # after scaffold's features, one line each
                if target == "train.py":  # a docstring line of <= 88
                    text = textwrap.shorten(line, 84, placeholder=" ...") + "\n"
                else:
                    text = f"- {line}\n"
                found.append(Block(target, "features", text, f"the feature list of {target}"))
    out = place(out, found)
    config = {}
    for layer in layers:
        config.update(layer.config)
    if config and "train.py" in out:
        out["train.py"] = _set_defaults(out["train.py"], config)
    return out


# the feature lists: train.py's docstring and README.md's "Features" (their "none" line goes when
# only layer features are chosen; the layer's lines go at their `features` point)
_NONE_LINES = {
    "train.py": re.compile(r"^    none: the plain core loop\n", re.M),
    "README.md": re.compile(r"^- none yet: .*\n(?:  .*\n)*", re.M),
}


def _set_defaults(data: bytes, config: dict) -> bytes:
    text = data.decode()
    for key, value in config.items():
        pattern = re.compile(rf"^(    {key}: \w+ = )([^#\n]+?)(  #.*)?$", re.M)
        text, count = pattern.subn(lambda m: f"{m.group(1)}{value!r}{m.group(3) or ''}", text, 1)
        if not count:
            raise ScaffoldError(
                f"layer default {key!r} names no Config field of train.py: remove it from the layer"
            )
    return text.encode()


# --- the team default -----------------------------------------------------------------------------


def config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "scaffold" / "config.toml"


# where $SCAFFOLD_LAYER's ":" is a URL's own: after a scheme ("https" + "//host/..."), after a
# host before its port ("ssh://host" + "22/..."), after an scp-like "user@host" + "team/x.git"
_URL_COLON = (
    (re.compile(r"[A-Za-z][A-Za-z0-9+.-]*"), re.compile(r"//")),
    (re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/]+"), re.compile(r"\d+(/|$)")),
    (re.compile(r"[^/@\s]+@[^/:\s]+"), re.compile(r"[^/]")),
)


def split_sources(value: str) -> list[str]:
    """$SCAFFOLD_LAYER's layers, separated by `:` as in PATH (`;` on Windows), where a URL's own
    colons (`https://host/x.git#v1`, `git@host:team/x.git#v1`) do not separate."""
    parts, sources = value.split(os.pathsep), []
    while parts:
        part = parts.pop(0)
        while parts and any(
            head.fullmatch(part) and tail.match(parts[0]) for head, tail in _URL_COLON
        ):
            part += ":" + parts.pop(0)
        if part.strip():
            sources.append(part.strip())
    return sources


def default_sources() -> list[str]:
    """The team default: $SCAFFOLD_LAYER, else `layers = [...]` in the user config file."""
    env = os.environ.get(ENV_VAR)
    if env is not None:
        return split_sources(env)
    path = config_file()
    if not path.is_file():
        return []
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        layers = data.get("layers", [])
        if isinstance(layers, str):
            layers = [layers]
        if not all(isinstance(s, str) for s in layers):
            raise ValueError("layers must be a list of strings")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ScaffoldError(f"{path} does not parse ({exc}): fix or delete it") from None
    return list(layers)


def cached() -> list[str]:
    """One line per layer in the cache: its URL and each commit checked out."""
    folder = cache.cache_dir("layers")
    lines = []
    for repo in sorted(folder.iterdir()) if folder else ():
        url_file = repo / "url"
        if not url_file.is_file():
            continue
        url = url_file.read_text().strip()
        for checkout in sorted(repo.iterdir()):
            if (checkout / MANIFEST).is_file():
                try:
                    check_tree(url, checkout)
                    layer = _load(url, checkout, checkout.name)
                    lines.append(f"{layer.name} {layer.version}  {url} @ {checkout.name[:12]}")
                except ScaffoldError as exc:
                    lines.append(f"(broken) {url} @ {checkout.name[:12]}: {exc}")
    return lines


def changes(before: tuple[Pin, ...], after: tuple[Pin, ...]) -> list[str]:
    """One line per layer whose version or identity differs between two sets of pins."""
    old = {pin.source: pin for pin in before}
    lines = []
    for pin in after:
        was = old.get(pin.source)
        if was is None:
            lines.append(f"layer {pin.name} {pin.version} added")
        elif was.identity != pin.identity:
            lines.append(
                f"layer {pin.name} {was.version} ({_short_id(was.identity)}) -> "
                f"{pin.version} ({_short_id(pin.identity)})"
            )
    return lines


def _short_id(identity: str) -> str:
    return identity.removeprefix("sha256:")[:12]
