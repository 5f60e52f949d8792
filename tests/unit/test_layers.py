"""The layers of src/dgxmm (docs/architecture.md): each package imports only from the layers
below it, no two packages of a layer import each other, and no modules import each other in a
cycle; and the rule the page's table states for a single package (its notes column: what the
foundation, engineclient, the controller, the front, the gateway and telemetry may import or
must implement). Read from the source (every ``import``, those inside functions and
``TYPE_CHECKING`` blocks included), so no import-time side effect can hide an edge."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "dgxmm"

# Lowest first. A unit is a top-level module or package of dgxmm ("dgxmm" is the package's own
# __init__, which holds the version). Units of one layer may not import each other, but for the
# foundation, whose few modules may (acyclically).
LAYERS: list[set[str]] = [
    {"dgxmm", "settings", "errors", "onethread", "datadir", "supervisor", "logs", "records"},
    {"store"},
    {"events"},
    {"deploy", "modelstore"},
    {"engineclient"},
    {"controller"},
    {"front"},
    {"gateway"},
    {"telemetry"},
    {"status", "litellm"},
    {"context"},
    {"api", "web"},
    {"declared"},
    {"asgi"},
    {"app"},
    {"cli", "demo"},
]
FOUNDATION = LAYERS[0]


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_of(path): path for path in PACKAGE.rglob("*.py")}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dgxmm"


def layer_of(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def imports_of(path: Path, *, runtime_only: bool = False) -> set[str]:
    """The dgxmm modules ``path`` imports (a name imported from a package counts as its module
    when it is one). ``runtime_only`` leaves out ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("dgxmm"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("dgxmm"))
    return found - {module_of(path)}


def edges() -> Iterator[tuple[str, str]]:
    for module, path in MODULES.items():
        for target in imports_of(path):
            yield module, target


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module) for module in MODULES}
    assert units <= set().union(*LAYERS), units - set().union(*LAYERS)
    assert len(set().union(*LAYERS)) == sum(len(layer) for layer in LAYERS), "a unit in two layers"


def test_every_import_goes_down() -> None:
    upward = sorted(f"{a} -> {b}" for a, b in edges() if layer_of(unit_of(b)) > layer_of(unit_of(a)))
    assert upward == []


def test_no_unit_imports_another_of_its_layer() -> None:
    sideways = sorted(
        f"{a} -> {b}"
        for a, b in edges()
        if unit_of(a) != unit_of(b) and layer_of(unit_of(a)) == layer_of(unit_of(b)) and unit_of(a) not in FOUNDATION
    )
    assert sideways == []


def test_no_import_cycle_between_modules() -> None:
    graph = {module: imports_of(path, runtime_only=True) & MODULES.keys() for module, path in MODULES.items()}
    seen: dict[str, int] = {}  # 1: on the path, 2: done
    cycle: list[str] = []

    def visit(module: str, path: list[str]) -> bool:
        seen[module] = 1
        for target in sorted(graph[module]):
            if seen.get(target) == 1:
                cycle.extend(path[path.index(target) :] + [module, target] if target in path else [module, target])
                return True
            if target not in seen and visit(target, [*path, module]):
                return True
        seen[module] = 2
        return False

    for module in sorted(graph):
        if module not in seen and visit(module, []):
            break
    assert cycle == []


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("dgxmm.deploy.deployer", "dgxmm.telemetry.metrics"),  # the deployer reports through deploy.starts.StartReport
        ("dgxmm.store.db", "dgxmm.deploy"),  # the record is in records/, below both
        ("dgxmm.context", "dgxmm.api"),  # views are status.view's, so the API can read the context
    ],
)
def test_the_checks_see_edges_that_were_cut(importer: str, imported: str) -> None:
    """Edges that once existed: had they come back, the layers above would say so (these hold
    the checks themselves to finding them)."""
    path = MODULES[importer]
    assert not any(target == imported or target.startswith(imported + ".") for target in imports_of(path))
    assert layer_of(unit_of(imported)) > layer_of(unit_of(importer))


# --- the rules docs/architecture.md states for single packages (its table's notes column) -------


def dgxmm_units_of(unit: str, *, but: frozenset[str] = frozenset()) -> dict[str, set[str]]:
    """The other dgxmm units each module of ``unit`` imports (modules named in ``but`` left out)."""
    return {
        module: {unit_of(target) for target in imports_of(path)} - {unit}
        for module, path in MODULES.items()
        if unit_of(module) == unit and module not in but
    }


def libraries_of(path: Path) -> set[str]:
    """The modules outside dgxmm that ``path`` imports, dotted in full (``starlette.types``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if not name.startswith("dgxmm")}


def test_the_foundation_imports_only_the_foundation() -> None:
    """Layer 0, "the foundation", which any package may import: it leans on nothing of dgxmm's
    above it."""
    above = {module: units - FOUNDATION for unit in FOUNDATION for module, units in dgxmm_units_of(unit).items()}
    assert {module: units for module, units in above.items() if units} == {}


def test_engineclient_imports_only_settings() -> None:
    """Layer 4: "imports only ``settings``"."""
    others = {module: units for module, units in dgxmm_units_of("engineclient").items() if units - {"settings"}}
    assert others == {}
    assert "settings" in set().union(*dgxmm_units_of("engineclient").values())  # the rule sees the edge


def test_the_controller_acts_on_deployments_through_its_effects() -> None:
    """Layer 5: "acts on deployments through ``controller.effects.Effects``". No module of the
    controller holds the concrete deployer: effects.py (``DeployerEffects``) takes a Protocol of
    what it needs of it (``DeployerPort``), and app.py hands it the deployer, which the type
    checker verifies against that Protocol. The controller takes values and pure functions from
    ``deploy`` (an exception, a budget's snapshot, placement's arithmetic, a sample), nothing
    that acts."""
    values = {"dgxmm.deploy.budget", "dgxmm.deploy.placement", "dgxmm.deploy.sampler"}
    acting = sorted(
        f"{module} -> {target}"
        for module, path in MODULES.items()
        if unit_of(module) == "controller"
        for target in imports_of(path)
        if unit_of(target) == "deploy" and target not in values
    )
    assert acting == []
    concrete = {"dgxmm.deploy.deployer", "dgxmm.events"}
    held = sorted(
        f"{module} -> {target}"
        for module, path in MODULES.items()
        if unit_of(module) == "controller"
        for target in imports_of(path)
        if target in concrete
    )
    assert held == []


def test_the_front_knows_nothing_of_the_application_but_the_asgi_interface() -> None:
    """Layer 6: the HTTP server takes nothing of dgxmm's but the foundation (its settings, the
    error envelope), no web framework, and of Starlette only the ASGI types."""
    application = {
        module: units - FOUNDATION for module, units in dgxmm_units_of("front").items() if units - FOUNDATION
    }
    assert application == {}
    frameworks = sorted(
        f"{module} -> {library}"
        for module, path in MODULES.items()
        if unit_of(module) == "front"
        for library in libraries_of(path)
        if library.split(".")[0] in ("fastapi", "starlette") and library != "starlette.types"
    )
    assert frameworks == []


def test_the_gateway_reads_every_request_through_asgirequest() -> None:
    """Layer 7: "reads every request through ``AsgiRequest``". Only gateway/asgirequest.py
    touches the ASGI interface (or any web framework); the rest reads the ``GatewayRequest``
    shape (request.py), and ``AsgiRequest`` is the one class in src of that shape."""
    asgi = sorted(
        f"{module} -> {library}"
        for module, path in MODULES.items()
        if unit_of(module) == "gateway" and module != "dgxmm.gateway.asgirequest"
        for library in libraries_of(path)
        if library.split(".")[0] in ("starlette", "fastapi", "uvicorn")
    )
    assert asgi == []
    shape = {"body", "respond", "start", "write", "end", "cut"}
    of_the_shape = sorted(
        f"{module}.{node.name}"
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and shape <= {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    )
    assert of_the_shape == ["dgxmm.gateway.asgirequest.AsgiRequest", "dgxmm.gateway.request.GatewayRequest"]


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [
        ("dgxmm.deploy.starts.StartReport", "dgxmm.telemetry.metrics.Metrics"),
        ("dgxmm.controller.effects.Report", "dgxmm.telemetry.metrics.Metrics"),
        ("dgxmm.gateway.exchange.Finish", "dgxmm.telemetry.access.Finisher"),
    ],
)
def test_telemetry_implements_the_reports_of_the_layers_below(protocol: str, implementation: str) -> None:
    """Layer 8: "implements the reports of the layers below", the three the page names: every
    method of each Protocol, with its parameters (mypy checks the wiring in app.py; this holds
    the page's claim of which class it is)."""
    import importlib
    import inspect

    def named(dotted: str) -> type:
        module, name = dotted.rsplit(".", 1)
        found: type = getattr(importlib.import_module(module), name)
        return found

    proto, impl = named(protocol), named(implementation)
    members = [
        name
        for name, value in vars(proto).items()
        if callable(value) and (name == "__call__" or not name.startswith("_"))
    ]
    assert members
    for name in members:
        assert str(inspect.signature(getattr(impl, name))) == str(inspect.signature(getattr(proto, name))), name


# --- collaborators are what a module calls of them (issue 36) ------------------------------------

CONCRETE = {"dgxmm.deploy.deployer": "Deployer", "dgxmm.controller.controller": "Controller"}
# Who may hold the class itself: the composition root, the context it fills, and the class's own
# package.
MAY_HOLD = {"dgxmm.app", "dgxmm.context"}


def concrete_imports(path: Path) -> set[str]:
    """The modules of ``CONCRETE`` whose class ``path`` imports, by name or with its module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module in CONCRETE:
            if any(alias.name in (CONCRETE[node.module], "*") for alias in node.names):
                found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in CONCRETE)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in CONCRETE)
    return found


def test_only_the_composition_root_holds_the_concrete_deployer_and_controller() -> None:
    """docs/architecture.md: a module takes the deployer and the controller as Protocols of what
    it calls of them (``gateway.Records`` and ``Slots``, ``router.Names`` and ``Phases``, the
    playground's ``Records``, ``status.live.Records`` and ``OnDemand``...), so that what it may do
    to them is written where it is used and the checker holds each side to it; only app.py, which
    builds them, and context.py, which carries them, name the classes (and the class's own
    package: deploy.reconcile works on the deployer it belongs to)."""
    holders = sorted(
        f"{module} -> {CONCRETE[source]}"
        for module, path in MODULES.items()
        if module not in MAY_HOLD
        for source in concrete_imports(path)
        if unit_of(module) != unit_of(source)
    )
    assert holders == []


def test_the_collaborator_rule_sees_each_way_of_importing_the_classes(tmp_path: Path) -> None:
    """The rule above finds the class imported by name, with its module, or as the module."""
    deployer, controller = "dgxmm.deploy.deployer", "dgxmm.controller.controller"
    spelled = {
        "from dgxmm.deploy.deployer import Deployer\n": {deployer},
        "from dgxmm.controller.controller import Controller as C\n": {controller},
        "from dgxmm.controller import controller\n": {controller},
        "import dgxmm.deploy.deployer\n": {deployer},
        "from dgxmm.deploy.deployer import SHUTDOWN_REASON\n": set(),
    }
    for source, expected in spelled.items():
        (tmp_path / "m.py").write_text(source)
        assert concrete_imports(tmp_path / "m.py") == expected, source


# --- a deployment is changed through named writes (issue 48 item 2) ------------------------------

GENERIC_WRITES = frozenset({"set_state", "update"})  # the deployer's generic writes (deploy/edits.py)


def generic_writes(path: Path) -> list[str]:
    """The calls in ``path`` of a generic write of deployment records: ``set_state`` on anything,
    ``update`` on a receiver named as the deployer or its records are (``dict.update`` is not)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, ast.unparse(node.func.value)
        if name == "set_state" or (
            name == "update" and receiver.rsplit(".", 1)[-1] in ("deployer", "_deployer", "_records", "records")
        ):
            found.append(f"{receiver}.{name} at line {node.lineno}")
    return found


def test_no_module_outside_deploy_calls_a_generic_deployment_write() -> None:
    """Outside deploy/, a part that changes a deployment calls a named write that says what it
    does (``reconfigure``, ``reset_after_edit``, ``switch_mode``, ``pend_mode``,
    ``move_declaration``, ``restart``, ``stop`` ...), never ``set_state`` or ``update``."""
    calls = sorted(
        f"{module}: {call}"
        for module, path in MODULES.items()
        if unit_of(module) != "deploy"
        for call in generic_writes(path)
    )
    assert calls == []


def test_the_write_rule_sees_a_generic_write(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "ctx.deployer.set_state(i, s)\nself._deployer.update(i, mode=m)\nfound.update(x)\nrecords.update(i, a=1)\n"
    )
    assert generic_writes(tmp_path / "m.py") == [
        "ctx.deployer.set_state at line 1",
        "self._deployer.update at line 2",
        "records.update at line 4",
    ]


# --- one port, one definition (issue 48 item 4) ---------------------------------------------------


def protocol_bodies(path: Path) -> dict[str, tuple[str, ...]]:
    """The Protocols ``path`` defines, each as its members' source (docstrings left out)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(base).endswith("Protocol") for base in node.bases):
            members = (
                ast.unparse(s) for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            )
            found[node.name] = tuple(sorted(members))
    return found


def test_no_protocol_is_defined_twice() -> None:
    """An interface is defined once, where its role is, and imported by every part that needs
    it: two Protocols with the same members are one port written twice."""
    seen: dict[tuple[str, ...], list[str]] = {}
    for module, path in MODULES.items():
        for name, members in protocol_bodies(path).items():
            seen.setdefault(members, []).append(f"{module}.{name}")
    assert [places for places in seen.values() if len(places) > 1] == []
