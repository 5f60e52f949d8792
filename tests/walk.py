"""The walk of a request through dgxmm's code, traced at run time (issue 48 item 5).

``Walk`` records every call of a dgxmm function on the thread that owns all state (the event
loop's: ``sys.setprofile`` is per thread) while it is on, and reads three figures of it:

- **modules**: the dgxmm modules a function of which ran;
- **moves**: the calls whose nearest dgxmm caller is in another module;
- **bounces**: the back-and-forth between packages: in the order the calls came, a package left
  for another and entered again at the next change (``gateway`` → ``controller`` → ``gateway``);
- **upcalls**: the calls from a package into one of a higher layer (tests/unit/test_layers.py's
  ``LAYERS``): a lower layer calling back up, through a callback or a listener the import graph
  does not show.

Calls that asyncio makes (a task's step, a callback) have no dgxmm caller: they enter the walk
and are no move. Calls on the tasks named in ``ignored`` are not counted, nor those of the task
that entered the walk (the test's own polling): work that runs on its own clock (the loop-lag
sampler ticks every 50 ms) would make the walk longer on a slower machine. Nothing here changes
what it watches; the figures are counts of calls, not times, so a busy machine gives the same walk.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from unit.test_layers import PACKAGE, SRC, layer_of, unit_of

ROOT = str(PACKAGE) + "/"


def module_at(filename: str) -> str | None:
    if not filename.startswith(ROOT):
        return None
    return ".".join(Path(filename).relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


@dataclass
class Walk:
    modules: Counter[str] = field(default_factory=Counter)
    moves: Counter[tuple[str, str]] = field(default_factory=Counter)
    upcalls: Counter[tuple[str, str]] = field(default_factory=Counter)
    bounces: Counter[tuple[str, str]] = field(default_factory=Counter)
    calls: int = 0
    ignored: frozenset[str] = frozenset()  # the names of tasks whose calls are not the walk's
    _units: list[str] = field(default_factory=list)  # the packages in the order the calls came, each change

    _own: asyncio.Task[Any] | None = None

    def __enter__(self) -> Walk:
        self._own = asyncio.current_task()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = module_at(frame.f_code.co_filename)
        if module is None:
            return
        task = asyncio.current_task()
        if task is not None and (task is self._own or task.get_name() in self.ignored):
            return
        self.calls += 1
        self.modules[module] += 1
        unit = unit_of(module)
        if not self._units or self._units[-1] != unit:
            if len(self._units) >= 2 and self._units[-2] == unit:
                self.bounces[(self._units[-1], unit)] += 1
            self._units.append(unit)
        caller = frame.f_back
        while caller is not None and module_at(caller.f_code.co_filename) is None:
            caller = caller.f_back
        if caller is None:
            return
        source = module_at(caller.f_code.co_filename)
        assert source is not None
        if source == module:
            return
        self.moves[(source, module)] += 1
        if layer_of(unit_of(source)) < layer_of(unit_of(module)):
            self.upcalls[(source, module)] += 1

    def figures(self) -> dict[str, int]:
        return {
            "modules": len(self.modules),
            "moves": sum(self.moves.values()),
            "bounces": sum(self.bounces.values()),
            "upcalls": sum(self.upcalls.values()),
            "calls": self.calls,
        }

    def report(self) -> str:
        lines = [f"{self.figures()}"]
        lines += [f"  bounce {a} <-> {b} x{n}" for (a, b), n in self.bounces.most_common()]
        lines += [f"  upcall {a} -> {b} x{n}" for (a, b), n in self.upcalls.most_common()]
        lines += [f"  module {m} x{n}" for m, n in sorted(self.modules.items())]
        return "\n".join(lines)
