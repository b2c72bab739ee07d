"""A second process that lowers and prices kernels the search will ask for later.

Most of a large search is spent in ``Planner._kernel``: lowering a kernel and pricing its tile configs,
a pure function of the kernel's cache key. Each partition pass walks a list of derivation variants in
order; a forked helper walks the same list from its last variant back, running the same partitions
with the same cache keys, and sends every kernel it finishes down a pipe. The search, on a kernel its
own cache lacks, first takes what the helper has sent. Where the two meet, the helper waits for the
next pass's list (the operand pass's variants depend on the first pass's ranking, which only the search
knows).

Why the plan cannot change: a prefetched entry is the value the search would have computed for that
key (the same code on a copy of the same planner), and everything that depends on the order of work
(the work budget, which charges a merge by whether this process's cache already held it, and the
rejection counts) is kept by the search alone. Whether an entry arrives in time only decides who
computes it. ``tests/test_prefetch.py`` plans with and without the helper and compares bytes.

The helper is a ``fork`` of the planning process: it starts with the planner's caches and variants as
they are, and only ever writes to its pipe. Keys and values are pickled with the variants' terms sent
by address (both processes hold them at the same one since the fork). Where ``fork`` is unavailable,
the caller is not the main thread, fewer than two CPUs are usable or the search is small, the search
runs alone.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

MIN_VARIANTS = 8
"""Derivation variants below which the search runs alone (a fork costs more than it saves)."""
BATCH = 16
"""Kernels per message from the helper: fewer, larger writes (the search reads between kernels)."""
ENABLED = True
"""Off: every search runs in one process (the determinism test compares both)."""
POLL_S = 0.001
"""How often the helper looks for the next pass's variants while it waits (not a budget: the search
never waits for the helper, and no plan depends on when anything arrives)."""

Send = Callable[[tuple, Any], None]
Stop = Callable[[int, int], bool]
NextPass = Callable[[int], Sequence[int] | None]

_FRAME = struct.Struct("<Q")
_WORD = struct.Struct("<q")
_CLOSED = 1 << 62
_MAX_LISTED = mmap.PAGESIZE // _WORD.size - 3


class Met(Exception):
    """Raised in the helper once the search has reached the variant it is exploring."""


def usable_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a helper may be forked here: a POSIX ``fork``, two CPUs, and the main thread (a fork
    from another thread copies one thread of a process whose other threads may hold locks)."""
    return (ENABLED and hasattr(os, "fork") and usable_cpus() >= 2
            and threading.current_thread() is threading.main_thread())


class _Board:
    """One shared page: the pass the search is in, the variant it has reached, and the pass's list of
    variant indices (words 0, 1 and 2.. of the page)."""

    def __init__(self) -> None:
        self.page = mmap.mmap(-1, mmap.PAGESIZE)
        self._put(0, 0)
        self._put(1, -1)

    def _put(self, word: int, value: int) -> None:
        self.page[word * _WORD.size:(word + 1) * _WORD.size] = _WORD.pack(value)

    def _get(self, word: int) -> int:
        return _WORD.unpack(self.page[word * _WORD.size:(word + 1) * _WORD.size])[0]

    def position(self) -> tuple[int, int]:
        return self._get(0), self._get(1)

    def reach(self, at: int) -> None:
        self._put(1, at)

    def open_pass(self, number: int, listed: Sequence[int]) -> None:
        """Publish pass ``number``'s variants (the list first, the pass number last: the helper reads
        the number, then the list)."""
        listed = list(listed)[:_MAX_LISTED]
        self._put(2, len(listed))
        for j, i in enumerate(listed):
            self._put(3 + j, i)
        self._put(1, -1)
        self._put(0, number)

    def listed(self) -> list[int]:
        return [self._get(3 + j) for j in range(self._get(2))]

    def close(self) -> None:
        self._put(0, _CLOSED)


class _Shared:
    """Objects both processes hold at one address since the fork (the variants' terms): pickled by that
    address, so a key costs a few bytes and comes back as the very object the search holds."""

    def __init__(self, objects: Iterable[object]) -> None:
        self.by_id = {id(o): o for o in objects}

    def dumps(self, obj: object) -> bytes:
        buf = io.BytesIO()
        pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        by_id = self.by_id
        pickler.persistent_id = lambda o: id(o) if by_id.get(id(o), _Shared) is o else None  # never None itself
        pickler.dump(obj)
        return buf.getvalue()

    def loads(self, data: bytes) -> Any:
        unpickler = pickle.Unpickler(io.BytesIO(data))  # noqa: S301 - written by our own forked helper
        unpickler.persistent_load = self.by_id.__getitem__
        return unpickler.load()


class Prefetch:
    """The search's side: the helper's pipe, what it has sent (values still pickled: most are never
    asked for), and where the search is."""

    def __init__(self, fd: int, pid: int, board: _Board, shared: _Shared) -> None:
        self._fd, self._pid, self._board, self._shared = fd, pid, board, shared
        self._buf = bytearray()
        self._got: dict[tuple, bytes] = {}
        self._open = True
        self.taken = 0
        """Entries the search took (how much of its work the helper did; no plan reads it)."""

    def reached(self, i: int) -> None:
        """The search is at entry ``i`` of the pass's list: the helper stops before any entry at or
        below it."""
        self._board.reach(i)

    def next_pass(self, listed: Sequence[int]) -> None:
        """The search starts another pass over these variants (indices into the first pass's list)."""
        number = self._board.position()[0] + 1
        self._board.open_pass(number, listed)

    def take(self, key: tuple) -> Any | None:
        """What the helper computed for ``key`` (a ``Planner._kernel`` cache key), if it has sent it."""
        self._drain()
        data = self._got.pop(key, None)
        if data is None:
            return None
        self.taken += 1
        return self._shared.loads(data)

    def _drain(self) -> None:
        while self._open:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._open = False
                break
            self._buf += chunk
        while len(self._buf) >= _FRAME.size:
            (n,) = _FRAME.unpack_from(self._buf)
            if len(self._buf) < _FRAME.size + n:
                break
            body = bytes(self._buf[_FRAME.size:_FRAME.size + n])
            del self._buf[:_FRAME.size + n]
            try:
                entries = self._shared.loads(body)
            except Exception:  # a helper that failed mid-write: the search computes the rest itself
                self._open = False
                break
            for key, value in entries:
                self._got.setdefault(key, value)

    def close(self) -> None:
        """Stop the helper and reap it."""
        self._board.close()
        try:
            os.kill(self._pid, 9)
        except OSError:
            pass
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:
            pass
        os.close(self._fd)
        self._board.page.close()
        self._got.clear()


def start(n_variants: int, shared: Iterable[object],
          work: Callable[[Send, Stop, NextPass], None]) -> Prefetch | None:
    """Fork a helper that runs ``work(send, stop, next_pass)``: ``send(key, value)`` for every kernel it
    computes, ``stop(p, i)`` true once the search has reached entry ``i`` of pass ``p`` (or a later pass),
    ``next_pass(p)`` the variants of pass ``p`` once the search has opened it (None once it has closed).
    None where no helper runs. ``shared``: objects made before the fork that keys and values hold."""
    if n_variants < MIN_VARIANTS or not can_fork():
        return None
    table = _Shared(shared)
    board = _Board()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the helper: never returns
        os.close(r)
        _helper(w, board, table, work)
    os.close(w)
    os.set_blocking(r, False)
    return Prefetch(r, pid, board, table)


def _helper(w: int, board: _Board, table: _Shared, work: Callable[[Send, Stop, NextPass], None]) -> None:
    batch: list[tuple[tuple, bytes]] = []
    parent = os.getppid()

    def flush() -> None:
        body = table.dumps(batch)
        data = _FRAME.pack(len(body)) + body
        while data:
            data = data[os.write(w, data):]
        batch.clear()

    def send(key: tuple, value: Any) -> None:
        batch.append((key, table.dumps(value)))
        if len(batch) >= BATCH:
            flush()

    def stop(number: int, i: int) -> bool:
        at_pass, at = board.position()
        return at_pass > number or (at_pass == number and at >= i)

    def next_pass(number: int) -> list[int] | None:
        if batch:
            flush()
        while True:
            at_pass, _ = board.position()
            if at_pass >= _CLOSED or at_pass > number or os.getppid() != parent:
                return None
            if at_pass == number:
                return board.listed()
            time.sleep(POLL_S)

    code = 0
    try:
        work(send, stop, next_pass)
        if batch:
            flush()
    except BaseException:  # noqa: BLE001 - whatever stops the helper, the search goes on alone
        code = 1
    finally:
        os._exit(code)
