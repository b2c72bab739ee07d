"""Reading and writing files whose paths a user gave: bounded, regular files only, atomic.

Graph and plan files are untrusted and may be anything a path can name: ``/dev/zero``
(endless), a FIFO (blocks forever on open), a huge file, a folder. Inputs are opened
non-blocking, must be regular files, and are read with a size bound. Outputs
(``--out``, results logs) must be regular files or not exist yet: writing over
``/dev/null`` or ``/proc/...`` is refused rather than replacing the device with a file,
and whole-file outputs are written to a temp file in the same folder and renamed.
Artifacts (rendered sources, CUDA files, cubins) are placed by ``inside``, which
refuses any path that would leave its output folder.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from pyrunner.errors import UserError

MAX_INPUT_BYTES = 16 * 1024 * 1024
"""Largest graph, plan or results file read (the catalog's biggest plan is ~40 KB)."""


def read_bounded(path: str | os.PathLike, what: str, error: type[Exception] = UserError,
                 limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``error`` (one line) for anything else.

    Opened with O_NONBLOCK so a FIFO cannot block the open, and checked with fstat on the open
    descriptor (no race between the check and the read).
    """
    p = str(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{what} file {p!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} file {p!r} is a directory") from None
    except OSError as e:
        raise error(f"cannot read {what} file {p!r}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{what} file {p!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} file {p!r} is not a regular file (a device, FIFO or socket)")
        if st.st_size > limit:
            raise error(f"{what} file {p!r} is {st.st_size} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise error(f"{what} file {p!r} is larger than the limit of {limit} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"cannot read {what} file {p!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_text_bounded(path: str | os.PathLike, what: str, error: type[Exception] = UserError,
                      limit: int = MAX_INPUT_BYTES) -> str:
    data = read_bounded(path, what, error, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} file {str(path)!r} is not UTF-8 text") from None


def check_output_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` if it may be written as a regular file: absent, or a regular file that is neither a
    symbolic link nor hard-linked elsewhere (writing would reach a file outside the output), in an
    existing folder."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UserError(f"{what} {str(p)!r}: {e.strerror or e}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UserError(f"{what} {str(p)!r} is a symbolic link; refusing to write through it")
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"{what} {str(p)!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{what} {str(p)!r} is not a regular file (a device, FIFO or socket); "
                            "refusing to write to it")
        if st.st_nlink > 1:
            raise UserError(f"{what} {str(p)!r} has {st.st_nlink} hard links; refusing to write to a file "
                            "shared with another path")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{what} {str(p)!r}: folder {str(parent)!r} does not exist")
    return p


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "output path") -> None:
    """Write a whole regular text file or nothing (``write_bytes_atomic``)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"cannot write {what} {str(path)!r}: the text holds {e.object[e.start:e.end]!a}, "
                        "which UTF-8 cannot encode") from None
    write_bytes_atomic(path, data, what)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, what: str = "output path") -> None:
    """The one writer of whole files: a fresh temp file (random name, created exclusively) in the same
    folder, then renamed over ``path``. A symbolic link or hard link planted at ``path`` is refused
    (``check_output_file``); the rename would replace it, never write through it, but a planted link
    is an attack or a mistake the user should hear about."""
    p = check_output_file(path, what)
    parent = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise UserError(f"cannot write {what} {str(p)!r}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write {what} {str(p)!r}: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_append(path: str | os.PathLike, what: str, error: type[Exception] = UserError) -> int:
    """A descriptor appending to ``path`` (created if missing): never through a symbolic link
    (O_NOFOLLOW) nor into a file hard-linked elsewhere, never a device or FIFO; ``error`` otherwise."""
    p = str(path)
    try:
        fd = os.open(p, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{what} {p!r} is a symbolic link; refusing to write through it") from None
        raise error(f"cannot write {what} {p!r}: {e.strerror or e}") from None
    st = os.fstat(fd)
    problem = ("is not a regular file (a device, FIFO or socket)" if not stat.S_ISREG(st.st_mode)
               else f"has {st.st_nlink} hard links; refusing to write to a file shared with another path"
               if st.st_nlink > 1 else "")
    if problem:
        os.close(fd)
        raise error(f"{what} {p!r} {problem}")
    return fd


def output_dir(path: str | os.PathLike, what: str) -> Path:
    """An output folder: created if missing; UserError if it is a file or cannot be created."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{what} {str(p)!r} exists and is not a directory") from None
    except OSError as e:
        raise UserError(f"{what} {str(p)!r} cannot be created: {e.strerror or e}") from None
    if not p.is_dir():
        raise UserError(f"{what} {str(p)!r} is not a directory")
    return p


def inside(root: str | os.PathLike, *parts: str) -> Path:
    """``root/parts...``, refusing a part that is not one plain path component or a result
    that resolves (symlinks followed) outside ``root``."""
    base = Path(root)
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\\" in part or "\0" in part:
            raise UserError(f"artifact path component {part!r} is not a plain file name")
    path = base.joinpath(*parts)
    real_root = os.path.realpath(base)
    real = os.path.realpath(path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise UserError(f"artifact path {str(path)!r} leaves its output folder {str(base)!r}")
    return path


def is_write_error(e: OSError) -> bool:
    """An OSError that is the user's environment (full disk, permissions), not our bug."""
    return e.errno in (errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR,
                       errno.EDQUOT, errno.EFBIG, errno.ENOENT, errno.ENXIO, errno.EIO)
