"""The import graph of ``agentcap`` and ``agentcap_envs`` has no cycle, and ``import agentcap`` stays light.

Every import statement counts, wherever it sits (module level, inside a function, under
``if TYPE_CHECKING:``): a function-local import hides a cycle from the interpreter until the day the
function runs first during the other module's import. Importing ``a.b.c`` also runs ``a/__init__.py``
and ``a/b/__init__.py``, so those are edges too; a module does not import its own package merely by
being in it.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentcap", "agentcap_envs")


def _modules() -> dict[str, Path]:
    """Every module of the packages: dotted name → file (a package is named by its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _with_parents(name: str, modules: dict[str, Path]) -> set[str]:
    """``a.b.c`` and the packages it runs on the way (``a``, ``a.b``), those that are ours."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``a.b.func`` → ``a.b``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules ``module``'s import statements run, its parent packages of each included."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (found := _resolve(alias.name, modules)) is not None:
                    targets |= _with_parents(found, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if (found := _resolve(source, modules)) is None:
                continue
            targets |= _with_parents(found, modules)
            if found == source:  # `from pkg import sub`: sub may be a module of pkg
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        targets.add(f"{source}.{alias.name}")
    targets.discard(module)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def cycle_through(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest cycle from ``start`` back to it inside ``members`` (breadth first), as ``[a, ..., a]``."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if child not in parent:
                parent[child] = node
                queue.append(child)
    raise ValueError(f"{start} is on no cycle inside {sorted(members)}")


def shortest_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle inside ``component``, as ``[a, b, ..., a]``."""
    return min((cycle_through(graph, set(component), m) for m in component), key=lambda c: (len(c), c))


def component_cycles(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """The shortest cycle through each member of ``component``, each named once, shortest first."""
    seen: dict[tuple[str, ...], str] = {}
    for member in component:
        cycle = cycle_through(graph, set(component), member)[:-1]
        turn = cycle.index(min(cycle))  # one name per cycle, whichever member it was found from
        canonical = tuple(cycle[turn:] + cycle[:turn])
        seen.setdefault(canonical, " -> ".join([*canonical, canonical[0]]))
    return [seen[c] for c in sorted(seen, key=lambda c: (len(c), c))]


def test_graph_sees_every_module() -> None:
    graph = import_graph()
    assert "agentcap" in graph and "agentcap.core.env" in graph and "agentcap_envs.cloze_caption" in graph
    # parents count: importing agentcap.core.env runs agentcap/__init__.py and agentcap/core/__init__.py
    assert {"agentcap", "agentcap.core", "agentcap.core.env"} <= graph["agentcap.core.check"]


def test_finds_a_planted_cycle() -> None:
    graph = {"a": {"a.b"}, "a.b": {"a.c"}, "a.c": {"a"}, "d": {"a"}}
    components = [c for c in strongly_connected(graph) if len(c) > 1]
    assert components == [["a", "a.b", "a.c"]]
    assert shortest_cycle(graph, components[0]) == ["a", "a.b", "a.c", "a"]
    assert component_cycles(graph, components[0]) == ["a -> a.b -> a.c -> a"]
    two = {"a": {"b", "c"}, "b": {"a"}, "c": {"b"}}
    assert component_cycles(two, ["a", "b", "c"]) == ["a -> b -> a", "a -> c -> b -> a"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    report = []
    for component in strongly_connected(graph):
        if len(component) > 1:
            report.append(f"strongly connected: {', '.join(component)}")
            report += [f"  {cycle}" for cycle in component_cycles(graph, component)]
    assert not report, "import cycles:\n" + "\n".join(report)


#: (importer prefix, imported prefixes it must never reach by a direct edge, why).
FORBIDDEN = (
    ("agentcap.", ("agentcap_envs",), "agentcap does not import its built-in environments"),
    ("agentcap.judges", ("agentcap.training", "agentcap.rollout"), "judges sit below training and rollout"),
    ("agentcap.rewards", ("agentcap.training", "agentcap.rollout"), "rewards sit below training and rollout"),
    ("agentcap_envs", ("agentcap.training",), "environments do not import training"),
)


def _under(module: str, prefix: str) -> bool:
    return module == prefix.rstrip(".") or module.startswith(prefix.rstrip(".") + ".")


def test_layers() -> None:
    graph = import_graph()
    wrong = [
        f"{source} -> {target} ({why})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        for importer, banned, why in FORBIDDEN
        if _under(source, importer) and any(_under(target, b) for b in banned)
    ]
    # core imports nothing of agentcap beyond core (and the top package every import of it runs)
    wrong += [
        f"{source} -> {target} (core imports only core)"
        for source, targets in sorted(graph.items())
        if _under(source, "agentcap.core")
        for target in sorted(targets)
        if target != "agentcap" and not _under(target, "agentcap.core")
    ]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


#: The folder order, bottom layer first (docs/architecture.md): a folder imports only folders of lower
#: layers, never one of its own layer or above. A folder is a sub-package of ``agentcap`` or one of its
#: top-level modules; ``agentcap_envs`` is one folder.
LAYERS = (
    ("core", "_lazy"),
    ("resume", "testing"),
    ("parallel", "algorithms"),
    ("agents",),
    ("judges",),
    ("rewards",),
    ("rollout", "data"),
    ("evaluation", "agentcap_envs"),
    ("training",),
    ("commands",),
    ("cli",),
    ("launcher",),
)


def folder_of(module: str) -> str | None:
    """``agentcap.judges.rule`` → ``judges``; ``agentcap_envs.toy.movie`` → ``agentcap_envs``; the top
    package ``agentcap`` itself is no folder (it only re-exports, lazily)."""
    parts = module.split(".")
    if parts[0] == "agentcap_envs":
        return "agentcap_envs"
    return parts[1] if len(parts) > 1 else None


def folder_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importer folder, imported folder) → the module imports behind that arrow."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = folder_of(source), folder_of(target)
            if a is not None and b is not None and a != b:
                arrows.setdefault((a, b), []).append(f"{source} -> {target}")
    return arrows


def upward(arrows: dict[tuple[str, str], list[str]]) -> list[str]:
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    wrong = []
    for (a, b), edges in sorted(arrows.items()):
        if a not in layer or b not in layer:
            wrong.append(f"{a} -> {b}: folder not in LAYERS (add it to tests/test_imports.py and docs/architecture.md)")
        elif layer[b] >= layer[a]:
            wrong += [f"{edge} (layer {layer[a]} {a} may not import layer {layer[b]} {b})" for edge in edges]
    return wrong


def test_every_folder_arrow_points_down() -> None:
    arrows = folder_graph(import_graph())
    assert not (wrong := upward(arrows)), "imports that point up the folder order:\n" + "\n".join(wrong)
    assert len(arrows) > 40  # the graph was read, not empty


def test_folder_rule_catches_a_planted_upward_import() -> None:
    graph = {"agentcap.core.env": {"agentcap.training.module"}, "agentcap.training.module": {"agentcap.core.env"}}
    assert upward(folder_graph(graph)) == [
        "agentcap.core.env -> agentcap.training.module (layer 0 core may not import layer 8 training)"
    ]


def test_import_agentcap_is_light() -> None:
    heavy = ("torch", "transformers", "agentcap_envs")
    code = (
        "import sys, agentcap\n"
        f"print(' '.join(m for m in {heavy!r} if any(k == m or k.startswith(m + '.') for k in sys.modules)))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert run.stdout.strip() == "", f"`import agentcap` imports {run.stdout.strip()}"


def test_lazy_reexports_resolve() -> None:
    """A package that re-exports lazily (``agentcap._lazy``) still hands out every name of its ``__all__``."""
    missing = []
    for name in sorted(import_graph()):
        package = importlib.import_module(name) if (ROOT / name.replace(".", "/") / "__init__.py").is_file() else None
        for attr in sorted(getattr(package, "__all__", ())):
            try:
                getattr(package, attr)
            except (AttributeError, ImportError) as error:
                missing.append(f"{name}.{attr}: {error}")
    assert not missing, "lazy re-exports that do not resolve:\n" + "\n".join(missing)


def _architecture_doc() -> str:
    return (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_architecture_doc_states_the_folder_order() -> None:
    text = _architecture_doc()
    stated = text.split("<!-- layers: checked by tests/test_imports.py -->")[1].split("<!-- /layers -->")[0].strip()
    assert stated == " → ".join(", ".join(layer) for layer in LAYERS)


def test_architecture_doc_lists_every_folder_and_entry_point() -> None:
    import tomllib

    layout = _architecture_doc().split("## Where things live")[1].split("```")[1]
    named = {line.split()[0] for line in layout.splitlines() if line.strip() and not line.startswith(" " * 6)}
    folders = {
        path.parent.name + "/" for package in PACKAGES for path in (ROOT / package).rglob("__init__.py")
    } | {path.name for path in (ROOT / "agentcap").glob("*.py")}
    assert not (missing := sorted(folders - named)), f"docs/architecture.md does not list {missing}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    entry_points = [*project["scripts"].values(), *project["entry-points"]["gymnasium.envs"].values()]
    assert all(f"`{target}`" in _architecture_doc() for target in entry_points), entry_points
