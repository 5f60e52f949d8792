"""The model files a change of the declared files needs, checked before anything is applied.

A declared llama.cpp deployment's ``model`` is checked as ``POST /api/deployments`` checks one
(api/modelcheck.py, the same rule and bounds): when the plan creates it, or changes its engine or
model. A path that does not exist, that dgxmm may not read or that is not a GGUF is an error of
the declaring file (file, line, table, field ``model``), and nothing of the change is applied.
The model store's ``hf://`` models are not checked (they may be downloading), nor models of the
docker runtime (paths inside a container).

Such an error is marked ``recheck``: the file it names may be on its way (a download, the demo
writing its model), so the watcher looks again at each poll and applies the change once the file
is there, without an edit of the declaring file. The reads run in one thread, off the event loop,
waited for at most ``modelcheck.DEADLINE_S`` together.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dgxmm.api import modelcheck
from dgxmm.api.modelcheck import ChecksBusy, bounded, is_checked
from dgxmm.declared.parse import Declaration
from dgxmm.declared.plan import Plan

ENGINE_FIELDS = frozenset({"engine", "model"})


def to_check(todo: Plan, declared: Sequence[Declaration], runtime: str) -> list[Declaration]:
    """The declarations whose model file ``todo`` needs: created, or given a new engine or model."""
    by_name = {decl.name: decl for decl in declared}
    names = [c.declaration.name for c in todo.created]
    names += [c.name for c in todo.changed if c.fields.keys() & ENGINE_FIELDS]
    return [
        by_name[name]
        for name in names
        if is_checked(runtime, by_name[name].fields["engine"], by_name[name].fields["model"])
    ]


def first_bad(paths: list[str], passed: list[str]) -> tuple[int, str] | None:
    """The first path that is no readable GGUF, with why (blocking); each good one is appended to
    ``passed`` as it is found good, so a caller that stopped waiting knows which one hung."""
    for index, path in enumerate(paths):
        why = modelcheck.why_not_gguf(Path(path))
        if why is not None:
            return index, why
        passed.append(path)
    return None


async def check_models(todo: Plan, declared: Sequence[Declaration], runtime: str) -> None:
    """Raise the declaring file's ``DeclarationError`` (``recheck``) for the first model of
    ``todo`` that cannot load; return when every one can."""
    checked = to_check(todo, declared, runtime)
    if not checked:
        return
    paths = [decl.fields["model"] for decl in checked]
    passed: list[str] = []
    try:
        bad = await bounded(lambda: first_bad(paths, passed))
    except TimeoutError:
        bad = (len(passed), f"its file did not answer within {modelcheck.DEADLINE_S:g} s")
    except ChecksBusy as exc:
        raise checked[0].error(f"not checked yet: {exc}", "model", recheck=True) from None
    if bad is not None:
        index, why = bad
        raise checked[index].error(f"{paths[index]}: {why}", "model", recheck=True)
