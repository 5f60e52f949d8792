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
    {
        "dgxmm",
        "settings",
        "errors",
        "onethread",
        "datadir",
        "stoprequest",
        "supervisor",
        "logs",
        "records",
        "boundedtoml",
    },
    {"store"},
    {"events"},
    {"deploy", "modelstore"},
    {"engineclient"},
    {"controller"},
    {"front"},
    {"gateway"},
    {"telemetry", "ollama", "llamacpp"},
    {"status", "litellm"},
    {"context"},
    {"api", "web"},
    {"declared"},
    {"migrate"},
    {"asgi", "assembly"},
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
    ``deploy`` (an exception, a budget's snapshot, placement's arithmetic, a sample, the table of
    an engine's out-of-memory lines), nothing that acts."""
    values = {"dgxmm.deploy.budget", "dgxmm.deploy.placement", "dgxmm.deploy.sampler", "dgxmm.deploy.oomlines"}
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
    shape (request.py), and ``AsgiRequest`` is the one class in src of that shape, but for the
    Ollama API's ``OllamaRequest`` and llama.cpp's model management's ``ModelsRequest``, which
    wrap an ``AsgiRequest`` and translate (ollama/, llamacpp/)."""
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
    assert of_the_shape == [
        "dgxmm.gateway.asgirequest.AsgiRequest",
        "dgxmm.gateway.request.GatewayRequest",
        "dgxmm.llamacpp.request.ModelsRequest",
        "dgxmm.ollama.request.OllamaRequest",
    ]


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
# Who may hold the class itself: the composition root (app.py and the builders it calls), the
# context it fills, and the class's own package.
MAY_HOLD = {"dgxmm.app", "dgxmm.context"} | {module for module in MODULES if unit_of(module) == "assembly"}


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
    it calls of them (``collaborators.DeploymentPeek`` and ``Slots``,
    ``router.NamedDeployments``, the playground's ``Door``, ``status.live.LiveDeployments`` and
    ``OnDemand``...), so that what it may do to them is written where it is used and the checker holds each side to it; only app.py, which
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


# --- one port, one definition (issue 48 item 4) ---------------------------------------------------


def protocol_bodies(path: Path) -> dict[str, tuple[str, ...]]:
    """The Protocols ``path`` defines, each as what it asks for: its methods' names and
    signatures and its attributes (docstrings, the class's and its methods', left out)."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(base).endswith("Protocol") for base in node.bases):
            members = []
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    returns = ast.unparse(member.returns) if member.returns else ""
                    members.append(f"{member.name}({ast.unparse(member.args)}) -> {returns}")
                elif isinstance(member, ast.AnnAssign):
                    members.append(ast.unparse(member))
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


def test_no_two_protocols_share_a_name() -> None:
    """One port, one name: a Protocol is named for its role, which no other has (six were once
    called ``Records``, each asking the deployer for something else)."""
    seen: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for name in protocol_bodies(path):
            seen.setdefault(name, []).append(module)
    assert {name: modules for name, modules in seen.items() if len(modules) > 1} == {}


def test_the_protocol_rule_sees_a_copy_with_other_docstrings(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        'class A(Protocol):\n    def f(self, x: int) -> str:\n        """doc"""\n\n'
        'class B(typing.Protocol):\n    """other"""\n\n    def f(self, x: int) -> str: ...\n'
    )
    assert protocol_bodies(tmp_path / "m.py") == {"A": ("f(self, x: int) -> str",), "B": ("f(self, x: int) -> str",)}


# --- the application assembled, not wired (issue 48 item 3) --------------------------------------


def context_writes(path: Path) -> list[str]:
    """The assignments in ``path`` to a field of the context: ``ctx.X = ...`` or ``context.X``
    (augmented and annotated ones too)."""

    def unpacked(target: ast.expr) -> list[ast.expr]:  # ``a, b = ...`` assigns a and b
        if isinstance(target, (ast.Tuple, ast.List)):
            return [t for element in target.elts for t in unpacked(element)]
        return [target.value] if isinstance(target, ast.Starred) else [target]

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in unpacked(target)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        found.extend(
            f"{ast.unparse(target)} at line {node.lineno}"
            for target in targets
            if isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in ("ctx", "context")
        )
    return found


def test_no_field_of_the_context_is_assigned_after_its_construction() -> None:
    """The builders (dgxmm.assembly) hand every part to ``Context`` as it is made, and the
    context is frozen: a part wired in by assignment afterwards would be one the type of the
    context does not promise when a route reads it."""
    from dgxmm.context import Context

    writes = sorted(f"{module}: {write}" for module, path in MODULES.items() for write in context_writes(path))
    assert writes == []
    assert Context.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_context_rule_sees_an_assignment(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "ctx.live = live\ncontext.limits, ctx.connections = a, b\nctx.bus.x = 1\nctx.n += 1\nx = ctx.live\n"
    )
    assert context_writes(tmp_path / "m.py") == [
        "ctx.live at line 1",
        "context.limits at line 2",
        "ctx.connections at line 2",
        "ctx.n at line 4",
    ]


MAX_FUNCTION_LINES = 80


def long_functions(path: Path) -> list[str]:
    """The functions in ``path`` of ``MAX_FUNCTION_LINES`` lines or more, from ``def`` to their
    last line."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 >= MAX_FUNCTION_LINES
    ]


def test_every_function_is_under_80_lines() -> None:
    """A function that long does several things: each is a function of its own, named for it."""
    long = sorted(f"{module}.{function}" for module, path in MODULES.items() for function in long_functions(path))
    assert long == []


def test_the_length_rule_sees_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "m.py").write_text(f"def short():\n    pass\n\n\nasync def long():\n{body}")
    assert long_functions(tmp_path / "m.py") == [f"long ({MAX_FUNCTION_LINES} lines)"]


def test_the_admin_api_takes_the_deployer_as_the_interfaces_of_its_ports() -> None:
    """A route takes what it calls of the deployer as a Protocol of ``api.ports`` (``Listing``,
    ``Editor``, ``Lifecycle``, ``EngineLogs``, ``Memory``), as the gateway takes its
    collaborators: only api/ports.py reads the context's concrete deployer."""
    reads = sorted(
        f"{module} at line {node.lineno}"
        for module, path in MODULES.items()
        if unit_of(module) == "api" and module != "dgxmm.api.ports"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "deployer"
    )
    assert reads == []
