"""The mbarrier ring of an explicitly warp-specialised loop (``render_ws``): which slot and phase a
loop step takes, the waits and arrives on each slot's full and empty barriers, the staged buffers'
names bound to one step's slot, and the once-per-tile barriers of tiles the producer loads beside
the ring. A persistent block's ring goes on across its tiles (``offset``): restarting the count per
tile would let a wait pass on the previous tile's phase.
"""

from __future__ import annotations

from pyrunner.backend.tilelang import emit as R


class Ring:
    """The ring of slots the producer fills and the consumers drain: slot and phase of a step, the
    mbarrier waits and arrives, and the staged buffers' names bound to one step's slot."""

    def __init__(self, w: R._Writer, ctx: R._Ctx, staged: list[str], first: str = "0",
                 once: tuple[str, ...] = ()) -> None:
        self.w, self.ctx, self.staged = w, ctx, staged
        self.first = first  # the loop's first step: slots and phases count from it (masked bounds start later)
        self.offset = ""  # steps of earlier tiles of a persistent block: the ring goes on across tiles
        self.tile = ""  # a persistent block's tile counter: the phase of the tiles loaded once per tile
        self.once = once  # prologue tiles the producer loads once per tile (one slot each)
        self.freed: set[str] = set()  # ... those the consumers freed already (release_once)
        self.stages = R._paren(R._stages(ctx.kernel))
        fresh = ctx.local.fresh
        self.full = {b: fresh(f"{b}_full") for b in (*staged, *once)}
        self.empty = {b: fresh(f"{b}_empty") for b in (*staged, *once)}
        self.names = {b: ctx.names[b] for b in staged}

    def _count(self, step: str) -> str:
        count = step if self.first == "0" else f"{step} - {self.first}"
        return f"({self.offset} + {count})" if self.offset else R._paren(count)

    def slot(self, step: str) -> str:
        return f"{self._count(step)} % {self.stages}"

    def parity(self, step: str) -> str:
        return f"({self._count(step)} // {self.stages}) % 2"

    def bind(self, step: str) -> None:
        """Point the staged buffers' names at ``step``'s slot (``unbind`` restores them)."""
        for b in self.staged:
            nd = len(self.ctx.buffers[b].axes)
            self.ctx.names[b] = f"{self.names[b]}[{self.slot(step)}, {', '.join([':'] * nd)}]"

    def bind_elements(self, step: str) -> None:
        """Element reads of the staged buffers (a Map's operands) index ``step``'s slot first."""
        self.unbind()
        self.ctx.slots = {b: self.slot(step) for b in self.staged}

    def unbind(self) -> None:
        self.ctx.names.update(self.names)
        self.ctx.slots = None

    def wait_full(self, bufs: list[str], step: str) -> None:
        for b in bufs:
            self.w.line(f"T.barrier_wait({self.full[b]}[{self.slot(step)}], {self.parity(step)})")

    def release(self, bufs: list[str], step: str) -> None:
        for b in bufs:
            self.w.line(f"T.barrier_arrive({self.empty[b]}[{self.slot(step)}])")

    def once_parity(self, producer: bool) -> str:
        """Parity of a once-per-tile barrier wait (the producer's empty wait passes on a fresh barrier)."""
        if not self.tile:
            return "1" if producer else "0"
        return f"1 - {self.tile} % 2" if producer else f"{self.tile} % 2"

    def release_once(self, bufs: list[str], why: str) -> None:
        """A persistent block's consumers free the once-per-tile tiles ``bufs`` for the next tile."""
        if self.tile:
            for b in bufs:
                self.w.line(f"T.barrier_arrive({self.empty[b]}[0])  # {b!r}: {why}")
        self.freed.update(bufs)
