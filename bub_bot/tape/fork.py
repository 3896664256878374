"""Forks as tapes: `fork(tape)` (also `Tape.fork()`) and `open_fork` (a resumed run's);
`ForkTape` itself lives beside `Tape` in tape.py (the stored side: tape/forks.py)."""

from __future__ import annotations

from .forks import ForkError
from .store import TapeStore
from .tape import ForkTape, Tape


async def fork(tape: Tape, *, tag: str = "") -> ForkTape:
    """Fork `tape` (and its sidecars) at its last entry; durable until merged or discarded."""
    return await tape.fork(tag=tag)


async def open_fork(store: TapeStore, name: str) -> ForkTape:
    """The live fork `name` (a resumed run's); ForkError when there is none."""
    point = await store.fork_point(name)
    if point is None:
        raise ForkError(f"{name!r} is not a fork (merged or discarded already?)")
    return ForkTape(store, point)


__all__ = ["ForkTape", "fork", "open_fork"]
