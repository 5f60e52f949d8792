"""The controller as one owner (issue 48, item 1; docs/controller.md, "One owner").

- Read from the source: ``ControllerState``'s fields, the fields of the tracks and waiters it
  holds, and its memory queue are written in controller/state.py only; every other module reads
  them or asks the owner's named methods.
- Driven step by step on the synchronous fake effects: the ledger change a decision's own restart
  makes is heard during the restart but applied after the decision, never inside it; a change
  heard outside a decision is applied at once.
- Targeted wake-ups: a change of one model wakes the waiters it concerns only; a change that
  neither holds, frees nor takes memory (a preparation's progress, a stopped model's edit) wakes
  no queued start, and one that frees memory does.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
from unit.fake_effects import Steps, steps
from unit.ondemand_harness import until

from dgxmm.controller.decide import Track
from dgxmm.controller.slots import Slot, Waiter
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Mode, State

pytestmark = pytest.mark.timeout(15)

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxmm"
CONTROLLER = PACKAGE / "controller"
OWNER = CONTROLLER / "state.py"
QUEUE_WRITES = {"join", "leave", "reserve", "unreserve"}  # MemoryQueue's writing methods


def state_fields() -> set[str]:
    """``ControllerState``'s fields (what its ``__init__`` assigns) and its read-only views."""
    tree = ast.parse(OWNER.read_text())
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ControllerState")
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            names.add(node.name)
    return names


def targets(node: ast.AST) -> Iterator[ast.expr]:
    """What ``node`` writes: the targets of an assignment, an augmented or annotated one, a
    ``del``, a ``for`` or a ``with ... as``."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from unpacked(target)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor):
        yield from unpacked(node.target)
    elif isinstance(node, ast.Delete):
        yield from node.targets
    elif isinstance(node, ast.NamedExpr):
        yield node.target


def unpacked(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from unpacked(element)
    else:
        yield target


def chain(expr: ast.expr) -> list[str]:
    """The names along an attribute or subscript chain: ``self.state.tracks["a"]`` is
    ``["self", "state", "tracks"]``."""
    names: list[str] = []
    while True:
        if isinstance(expr, ast.Attribute):
            names.append(expr.attr)
            expr = expr.value
        elif isinstance(expr, ast.Subscript):
            expr = expr.value
        elif isinstance(expr, ast.Name):
            names.append(expr.id)
            return names[::-1]
        else:
            return names[::-1]


def writes_in(label: str, source: str, *, in_controller: bool) -> list[str]:
    """The writes of the controller's state in one module's ``source`` (not the owner's)."""
    state = state_fields()
    held = {f.name for f in fields(Track)} | {f.name for f in fields(Waiter)}
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        for target in targets(node):
            names = chain(target)
            own = len(names) == 2 and names[0] == "self"  # a class's own field
            if isinstance(target, ast.Attribute) and not own and target.attr in state:
                found.append(f"{where} assigns {ast.unparse(target)}")
            elif isinstance(target, ast.Subscript) and any(
                a in ("state", "_state") and b in state for a, b in zip(names, names[1:], strict=False)
            ):
                found.append(f"{where} assigns {ast.unparse(target)}")
            elif in_controller and isinstance(target, ast.Attribute) and not own and target.attr in held:
                found.append(f"{where} assigns {ast.unparse(target)}")
        if in_controller and isinstance(node, ast.Call):
            names = chain(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr in QUEUE_WRITES and "queue" in names[:-1]:
                found.append(f"{where} calls {ast.unparse(node.func)}")
            if names[-1:] == ["setattr"] or names[-1:] == ["__setattr__"]:
                found.append(f"{where} calls {ast.unparse(node.func)}")
    return found


def test_the_controllers_state_is_written_by_its_owner_only() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != OWNER:
            label = str(path.relative_to(PACKAGE))
            found += writes_in(label, path.read_text(), in_controller=path.parent == CONTROLLER)
    assert found == []


def test_the_owner_check_finds_each_kind_of_write() -> None:
    """The check above can fail: each kind of write it looks for is found."""
    probe = [
        "def f(state, track, waiter, controller):",
        "    state._last_stop = 1.0",
        "    controller.state.tracks['a'] = track",
        "    track.inflight += 1",
        "    waiter.slot = None",
        "    state.queue.reserve('a', {})",
        "    object.__setattr__(track, 'owed', True)",
    ]
    found = writes_in("probe", "\n".join(probe) + "\n", in_controller=True)
    assert [line.split(" ")[0] for line in found] == [f"probe:{n}" for n in range(2, 8)], found


# --- no listener inside a decision ---------------------------------------------------------------


async def test_a_restarts_change_is_applied_after_the_decision_that_made_it() -> None:
    """The attempt's decision restarts the model: the deployer's change is told to the
    controller during the restart, but the controller applies it (its watchers hear it) only
    once the decision has ended, never half-way through it."""
    async with steps(capacity=10) as s:
        s.fx.add("a", 4)
        order: list[str] = []
        s.controller.add_watcher(lambda dep_id: order.append(f"applied {dep_id}"))
        restart = s.fx.restart

        def restart_and_note(deployment_id: str, **kw: object) -> None:
            order.append("restart begins")
            restart(deployment_id, **kw)  # type: ignore[arg-type]
            order.append("restart told its listeners")  # (the fake tells them before it returns)

        s.fx.restart = restart_and_note  # type: ignore[method-assign]
        task = asyncio.create_task(s.controller.acquire("a"))
        await until(lambda: s.fx.peek("a").state is State.STARTING)  # type: ignore[union-attr]
        begins = order.index("restart begins")
        told = order.index("restart told its listeners")
        assert order[begins + 1 : told] == []  # nothing of the controller's ran inside
        assert "applied a" in order[told:]  # and the change was applied after the decision
        s.fx.ready("a")
        (await task).release()


async def test_the_changes_of_a_preload_are_applied_after_it_in_their_order() -> None:
    async with steps(capacity=10) as s:
        for name in ("p1", "p2"):
            s.fx.add(name, 2)
            s.fx.update(name, preload=True)
        order: list[str] = []
        s.controller.add_watcher(lambda dep_id: order.append(f"applied {dep_id}"))
        s.fx.listeners.insert(0, lambda change: order.append(f"told {change.deployment.id}"))
        assert s.controller.preload() == ["p1", "p2"]
        assert order == ["told p1", "told p2", "applied p1", "applied p2"]


async def test_a_change_outside_a_decision_is_applied_at_once() -> None:
    async with steps(capacity=10) as s:
        s.fx.add("a", 4, State.READY)
        heard: list[str] = []
        s.controller.add_watcher(heard.append)
        s.fx.set_state("a", State.STOPPED)
        assert heard == ["a"]


async def test_a_mode_switchs_own_changes_are_applied_after_the_switch() -> None:
    """Switched to always on, a stopped model is started in the same decision: the changes the
    switch makes (its pending mode, its start) are applied after the switch's audit row."""
    async with steps(capacity=10) as s:
        s.fx.add("a", 4)
        order: list[str] = []
        s.controller.add_watcher(lambda dep_id: order.append(f"applied {dep_id}"))
        s.fx.listeners.insert(0, lambda change: order.append(f"told {change.kind}"))
        audit = s.fx.audit
        s.fx.audit = lambda action, **kw: (order.append(action), audit(action, **kw))  # type: ignore[method-assign]
        await s.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
        told, audited = order.index("told config"), order.index("ondemand_mode")
        assert "told state" in order[told:audited] and "applied a" not in order[told:audited]
        assert order[audited + 1 :].count("applied a") == 2  # the config change and the start


# --- targeted wake-ups ---------------------------------------------------------------------------


async def queued_behind_a_busy_model(s: Steps) -> tuple[asyncio.Task[Slot], asyncio.Task[Slot], Slot]:
    """q waits in the memory queue for busy's memory (busy has a request in flight: no victim);
    x is starting, with one waiter; c is a stopped model nobody waits for."""
    s.fx.add("busy", 6, State.READY)
    slot = await s.controller.acquire("busy")
    s.fx.add("x", 2, State.STARTING)
    s.fx.add("q", 6)
    s.fx.add("c", 1)
    x = asyncio.create_task(s.controller.acquire("x"))
    q = asyncio.create_task(s.controller.acquire("q"))
    await until(lambda: s.controller.queue_ids() == ["q"] and s.controller.total_waiting == 2)
    await until(lambda: all(t.done() for t in s.controller.state.attempts.values()))
    await until(lambda: not any(w.woken.is_set() for line in s.controller.state.waiters.values() for w in line))
    return x, q, slot


def woken(s: Steps, deployment_id: str) -> bool:
    (waiter,) = s.controller.state.waiters[deployment_id]
    return waiter.woken.is_set()


async def test_a_change_that_moves_no_memory_wakes_no_queued_start() -> None:
    async with steps(capacity=10) as s:
        x, q, slot = await queued_behind_a_busy_model(s)
        c = s.fx.peek("c")
        assert c is not None
        for listener in s.fx.listeners:
            listener(Change("progress", c))  # a preparation moved on
        s.fx.update("c", memory_gib=2)  # a stopped model's edit
        s.fx.set_state("c", State.PLANNED)  # its files are fetched again: still nothing held
        assert not woken(s, "q") and not woken(s, "x")
        s.fx.set_state("c", State.STARTING)  # c takes memory: the queue looks again, x does not
        assert woken(s, "q") and not woken(s, "x")
        for task in (x, q):
            task.cancel()
        await asyncio.gather(x, q, return_exceptions=True)
        slot.release()


async def test_a_change_of_one_model_wakes_its_own_waiters_not_anothers() -> None:
    async with steps(capacity=10) as s:
        x, q, slot = await queued_behind_a_busy_model(s)
        s.fx.update("q", memory_gib=5)  # q's own edit: q's waiter looks again, x's sleeps on
        assert woken(s, "q") and not woken(s, "x")
        s.fx.ready("x")
        (await x).release()
        q.cancel()
        await asyncio.gather(q, return_exceptions=True)
        slot.release()


async def test_memory_freed_wakes_the_queued_start() -> None:
    async with steps(capacity=10) as s:
        x, q, slot = await queued_behind_a_busy_model(s)
        s.fx.set_state("busy", State.STOPPED)  # stopped by hand: its memory is free
        assert woken(s, "q") and not woken(s, "x")
        for task in (x, q):
            task.cancel()
        await asyncio.gather(x, q, return_exceptions=True)
        slot.release()
