"""Packing a job's source on the client: files and directories into one tar, hashed so the
daemon stores it once by sha256. `.git` is never packed; each directory's `.gitignore` and
`.nodusignore` leave paths of its subtree out, as git reads them; the result says what it holds."""

from __future__ import annotations

import hashlib
import logging
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

from noduslocal.domain import errors
from noduslocal.domain.jobs import LARGE_SOURCE
from noduslocal.domain.units import fmt_bytes

IGNORE_FILE = ".nodusignore"
# Read in this order in each directory: the later file's patterns win, so a .nodusignore can
# take back what git ignores (`!small.csv`) as well as leave out what git tracks.
IGNORE_FILES = (".gitignore", IGNORE_FILE)
NEVER = ".git"  # a checkout's history (a directory) or a worktree's pointer (a file)
WARN_SIZE = 50 * 1024 * 1024  # bytes packed over which the upload names its biggest entries
WARN_FILES = 10_000  # files over which it does the same: each task unpacks every one
BIGGEST = 5  # entries named
LEFT_OUT = "(.git and ignored files left out)"

logger = logging.getLogger("noduslocal")


@dataclass(frozen=True)
class Packed:
    path: Path  # a temporary tar; the caller removes it
    sha256: str
    size: int  # bytes of the tar
    files: int = 0  # what is not a directory: files and links
    # Entries by the bytes of their files, the largest first, at most BIGGEST: the tar's
    # top level ("data/" for a directory), one level into each directory of an upload.
    biggest: tuple[tuple[str, int], ...] = ()
    origin: str = ""  # what was packed, as messages name it
    ignore_file: str | None = None  # the ignore file that would leave a top entry out


@dataclass(frozen=True)
class _Counts:
    files: int
    biggest: tuple[tuple[str, int], ...]
    origin: str
    ignore_file: str | None


# --- what is left out ---------------------------------------------------------------------

Layer = tuple[str, pathspec.GitIgnoreSpec]  # (directory relative to the root, "" or "a/b/")


def _read_rules(directory: str, entries: list[os.DirEntry[str]]) -> list[str]:
    lines: list[str] = []
    for name in IGNORE_FILES:
        entry = next((e for e in entries if e.name == name), None)
        # Not through a link, as git (2.32+) does not follow a symlinked .gitignore.
        if entry is not None and entry.is_file(follow_symlinks=False):
            with open(entry.path, encoding="utf-8", errors="surrogateescape") as file:
                lines += file.read().splitlines()
    return lines


def _ignored(layers: list[Layer], rel: str, is_dir: bool) -> bool:
    """As git decides: the deepest ignore file with a pattern that matches REL has the
    say, and within it the last such pattern; a directory is matched with its slash so
    `data/` leaves out the directory and not a file of that name."""
    for base, spec in reversed(layers):
        include = spec.check_file(rel[len(base):] + ("/" if is_dir else "")).include
        if include is not None:
            return include
    return False


def _listing(path: str, rel: str, layers: list[Layer]) -> tuple[Iterator[os.DirEntry[str]], str,
                                                                  bool]:
    """One directory's entries, sorted (one directory in memory, never the tree), and its
    ignore files pushed on LAYERS; returns (entries, rel, whether a layer was pushed)."""
    with os.scandir(path) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    rules = _read_rules(path, entries)
    if rules:
        layers.append((rel, pathspec.GitIgnoreSpec.from_lines(rules)))
    return iter(entries), rel, bool(rules)


def walk(root: Path) -> Iterator[tuple[str, str, bool]]:
    """(path, path relative to ROOT, is a directory) of what is packed under ROOT, in
    sorted pre-order (a directory before its contents, as a tar needs). Streams: an
    ignored directory is never opened, and only the open directories' listings are held."""
    layers: list[Layer] = []
    stack = [_listing(os.fspath(root), "", layers)]
    while stack:
        entries, rel_dir, pushed = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            if pushed:
                layers.pop()
            continue
        if entry.name == NEVER:
            continue
        rel = rel_dir + entry.name
        is_dir = entry.is_dir(follow_symlinks=False)  # a link is packed as a link
        if _ignored(layers, rel, is_dir):
            continue
        yield entry.path, rel, is_dir
        if is_dir:
            stack.append(_listing(entry.path, rel + "/", layers))


# --- packing ------------------------------------------------------------------------------

def pack(paths: list[Path], *, contents_of_single_dir: bool,
         allow_large: bool = False) -> Packed:
    """One tar of PATHS: each at its own name, or (`contents_of_single_dir`, the SDK's
    `source="dir"`) the contents of a single directory at the top. A path that cannot be
    read is InvalidArgument naming it, as one that does not exist."""
    try:
        return _pack(paths, contents_of_single_dir, allow_large)
    except OSError as exc:
        where = exc.filename or (paths[0] if len(paths) == 1 else "a source path")
        raise errors.InvalidArgument(
            f"source: {where}: {exc.strerror or exc} (leave what you cannot read out with a "
            f"{IGNORE_FILE})", field="source") from None


def _add(tar: tarfile.TarFile, path: str, arcname: str) -> int:
    """Add one entry (never recursing); returns its bytes, 0 for all but a regular file."""
    info = tar.gettarinfo(path, arcname)
    if info is None:  # a socket or another type tar cannot hold
        return 0
    if info.isreg():
        with open(path, "rb") as file:
            tar.addfile(info, file)
        return info.size
    tar.addfile(info)
    return 0


def _fill(tar: tarfile.TarFile, paths: list[Path], single: bool) -> _Counts:
    files = 0
    by_top: dict[str, int] = {}  # one entry per top-level name, never per file
    for path in paths:
        if not path.is_dir():
            by_top[path.name] = _add(tar, os.fspath(path), path.name)
            files += 1
            continue
        prefix = "" if single else f"{path.resolve().name}/"
        if prefix:
            tar.add(path, prefix.rstrip("/"), recursive=False)
        for full, rel, is_dir in walk(path):
            # Ranked one level into each packed directory: an uploaded pkg/ is not itself
            # what to leave out, its data/ is.
            top = prefix + rel.split("/", 1)[0] + ("/" if is_dir or "/" in rel else "")
            size = _add(tar, full, prefix + rel)
            by_top[top] = by_top.get(top, 0) + size
            files += not is_dir
    ranked = sorted(by_top.items(), key=lambda item: (-item[1], item[0]))[:BIGGEST]
    origin = str(paths[0].resolve()) if single else ", ".join(str(p) for p in paths)
    dirs = [p for p in paths if p.is_dir()]
    ignore_file = str(dirs[0].resolve() / IGNORE_FILE) if len(dirs) == 1 else None
    return _Counts(files, tuple(ranked), origin, ignore_file)


def _pack(paths: list[Path], contents_of_single_dir: bool, allow_large: bool) -> Packed:
    for path in paths:
        if not path.exists():
            raise errors.InvalidArgument(f"source: {path} does not exist", field="source")
    fd, name = tempfile.mkstemp(prefix="noduslocal-source-", suffix=".tar")
    os.close(fd)
    tmp = Path(name)
    single = contents_of_single_dir and len(paths) == 1 and paths[0].is_dir()
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            counts = _fill(tar, paths, single)
        size = tmp.stat().st_size
        packed = Packed(tmp, "", size, counts.files, counts.biggest, counts.origin,
                        counts.ignore_file)
        if size > LARGE_SOURCE and not allow_large:
            raise errors.InvalidArgument(
                f"source: {fmt_bytes(size)} packed; more than "
                f"{LARGE_SOURCE // 2**20} MiB needs allow_large_source=True "
                f"(or a {IGNORE_FILE} that leaves out data and checkpoints); "
                + "; ".join(_advice(packed)), field="source")
        digest = hashlib.sha256()
        with tmp.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        return Packed(tmp, digest.hexdigest(), size, counts.files, counts.biggest,
                      counts.origin, counts.ignore_file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --- what the upload says -----------------------------------------------------------------

def _advice(packed: Packed) -> list[str]:
    biggest = ", ".join(f"{name} {fmt_bytes(size)}" for name, size in packed.biggest)
    where = (f"add them to {packed.ignore_file} to leave them out" if packed.ignore_file
             else f"add them to a {IGNORE_FILE} in the directory that holds them to leave "
            "them out")
    return [f"the biggest: {biggest}", where]


def report(packed: Packed) -> tuple[int, str]:
    """(logging level, text) of what PACKED holds: one line, or over WARN_SIZE bytes or
    WARN_FILES files a warning that also names the biggest entries and the ignore file."""
    line = (f"code: {fmt_bytes(packed.size)} in {packed.files} "
            f"file{'s' if packed.files != 1 else ''} from {packed.origin} {LEFT_OUT}")
    if packed.size <= WARN_SIZE and packed.files <= WARN_FILES:
        return logging.INFO, line
    return logging.WARNING, "\n".join([line, *_advice(packed)])


def log(packed: Packed) -> None:
    """The SDK's way to say it: the "noduslocal" logger (a warning reaches stderr even where
    the program configured no logging, through Python's last-resort handler)."""
    level, text = report(packed)
    logger.log(level, text)
