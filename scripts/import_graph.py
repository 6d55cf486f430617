"""Print trl_multiturn's import graph by layer: floors, circles and arrows running back up (stdlib `ast` only).

    python scripts/import_graph.py [package_dir]      # default: trl_multiturn next to this script's folder

Each module's imports of other package modules are read from its source, the module-level ones and those inside
functions apart (a function-level import is a dependency too, only hidden). Three reports:

- floors: floor(m) = 0 for a module importing no package module, else 1 + the highest floor among the modules it
  imports (a circle counts as one module); the house drawn bottom up.
- circles: groups of modules that import each other, directly or through others (strongly connected components).
- arrows back up: imports from a module of a lower layer to one of a higher layer, the layers being the
  package's intended order (`LAYERS`, bottom first): e.g. an engine under `envs/` importing the rollout or a
  command.
- forbidden imports: imports of another library's modules that a layer may not use (`FORBIDDEN`): e.g. the rollout
  importing TRL's training utilities.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "trl_multiturn"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("lazy", "quiet", "config_checks", "registry", "cache", "progress", "data", "statistics",
              "run_lifetime", "model_layers")),
    ("contract", ("envs.base",)),
    ("envs", ("envs",)),
    ("rollout", ("rollout", "episode_data", "agents")),
    ("credit", ("credit",)),
    ("evaluation", ("evaluation", "episode_settings", "model_card", "plotting", "models", "model_setup", "expert",
                    "testing", "model_families")),
    ("trainers", ("trainers",)),
    ("commands", ("commands", "__init__")),
)
"""The package's intended layers, bottom first: a module belongs to the layer of the longest dotted prefix (after
`trl_multiturn.`) that names it; the top-level `trl_multiturn/__init__.py`, the public facade, is at the top. The
rollout plays episodes and knows nothing of the credit, which the trainers' step applies to the rows it lays out."""

FORBIDDEN: dict[str, tuple[str, ...]] = {"rollout": ("trl.trainer",)}
"""Per layer, the modules of other libraries (and their submodules) its modules may not import: the rollout uses
TRL's chat-template helpers only, never its training utilities (they belong to the trainers)."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, name: str, modules: set[str]) -> list[tuple[str, bool]]:
    """`(imported package module, at module level)` for each import in `path`'s source."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nested = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(function)}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` names a module; `from mod import name` names the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, id(node) not in nested))
    return found


def library_imports(path: Path) -> list[str]:
    """The absolute module names `path` imports (`import a.b`, `from a.b import c`: a.b), wherever in the file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
    return found


def layer_of(name: str) -> int:
    inner = name.partition(".")[2] or "__init__"
    best, best_length = len(LAYERS) - 1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (inner == prefix or inner.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the graph's strongly connected components."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
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
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def is_module(path: Path, root: Path) -> bool:
    """Whether `path` is a module of the package: every folder from `root` down to it has an `__init__.py`. Python
    files in other folders are data (the SWE-Gym tasks' shipped repositories)."""
    parts = path.parent.relative_to(root).parts
    return all((root.joinpath(*parts[:depth]) / "__init__.py").is_file() for depth in range(len(parts) + 1))


def main(root: Path) -> None:
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py")) if is_module(path, root)}
    modules = set(paths)
    edges: dict[str, dict[str, bool]] = defaultdict(dict)  # importer -> imported -> any import at module level
    for name, path in paths.items():
        for target, top in imports_of(path, name, modules):
            edges[name][target] = edges[name].get(target, False) or top
    graph = {name: set(edges[name]) for name in modules}
    components = strongly_connected(graph)
    component_of = {member: i for i, component in enumerate(components) for member in component}
    floor: dict[int, int] = {}
    for i, component in enumerate(components):  # Tarjan emits components after everything they reach
        reached = {component_of[t] for m in component for t in graph[m]} - {i}
        floor[i] = 1 + max((floor[j] for j in reached), default=-1)

    hidden = sum(not top for targets in edges.values() for top in targets.values())
    print(f"{len(modules)} modules, {sum(map(len, graph.values()))} package-internal import arrows "
          f"({hidden} only inside functions)\n")
    print("floors (0 = imports no package module):")
    by_floor = defaultdict(list)
    for i, component in enumerate(components):
        by_floor[floor[i]].append(" <-> ".join(component))
    for level in sorted(by_floor):
        print(f"  {level:2d}: {', '.join(sorted(by_floor[level]))}")
    circles = [component for component in components if len(component) > 1]
    print(f"\ncircles ({len(circles)}):")
    for component in circles:
        print("  " + " <-> ".join(component))
    print(f"\nlayers (bottom first): {' < '.join(name for name, _ in LAYERS)}")
    back = [(a, b, top) for a in sorted(edges) for b, top in sorted(edges[a].items()) if layer_of(b) > layer_of(a)]
    print(f"arrows back up ({len(back)}):")
    for a, b, top in back:
        where = "module level" if top else "inside a function"
        print(f"  {a} [{LAYERS[layer_of(a)][0]}] -> {b} [{LAYERS[layer_of(b)][0]}] ({where})")
    forbidden = [(name, target) for name, path in paths.items() for target in library_imports(path)
                 for banned in FORBIDDEN.get(LAYERS[layer_of(name)][0], ())
                 if target == banned or target.startswith(banned + ".")]
    print(f"forbidden imports ({len(forbidden)}):")
    for name, target in forbidden:
        print(f"  {name} [{LAYERS[layer_of(name)][0]}] -> {target}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / PACKAGE)
