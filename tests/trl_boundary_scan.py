"""Find every touch point of TRL, transformers, accelerate and vLLM in trl_multiturn's source (`ast`, no imports of
the scanned modules), for tests/trainers/test_trl_boundary.py to compare with `trl_compat.TOUCH_POINTS`.

A touch point is a use of one of those libraries beyond the public API (`trl_compat.PUBLIC_MODULES`'s names):

- `import`: a name imported from any other module of theirs (`from trl.trainer.utils import pad`), or a private
  module or name: `Use("import", "trl.trainer.utils", "pad")`.
- `module`: an attribute of such a module bound by `import a.b.c as m` (`m.name`, read or assigned):
  `Use("module", "a.b.c", "name", assigned)`.
- `private`: `x._name` (read, assigned, or through `getattr`/`setattr`/`hasattr` with a literal name) where no class,
  function or attribute of trl_multiturn is called `_name`, and Python's own underscore API is excluded:
  `Use("private", "", "_name")`; a further attribute `x._name.y` is `Use("private", "", "_name.y")`.
- `state`: `self.name`, `super().name` or `trainer.name` in the trainers' code where `name` is an attribute or
  method of TRL's or transformers' trainer classes (set in their source or defined on the class) that trl_multiturn
  neither defines nor counts as the Trainer's public API (`trl_compat.TRAINER_PUBLIC`): `Use("state", "", "name")`,
  with `name.y` for a further attribute.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

LIBRARIES = ("trl", "transformers", "vllm", "accelerate")

# Python's own underscore names (namedtuple's and enum's API; `sys._base_executable` and argparse's `_actions`,
# `_SubParsersAction`, `_check_value` and `_get_value`, the standard library's private names that envs/ and commands/
# read): outside the TRL boundary.
PYTHON_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit", "_getframe",
                     "_name_", "_value_", "_missing_", "_generate_next_value_", "_base_executable", "_actions",
                     "_SubParsersAction", "_check_value", "_get_value"}


@dataclass(frozen=True)
class Use:
    kind: str
    module: str
    name: str
    assigned: bool = False
    where: str = ""


def is_library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def _chain(node: ast.Attribute) -> list[str]:
    """`a.b.c` -> ['a', 'b', 'c'] (the base as '' when it is not a name)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    base = node.id if isinstance(node, ast.Name) else ("super()" if isinstance(node, ast.Call) and isinstance(
        node.func, ast.Name) and node.func.id == "super" else "")
    return [base, *reversed(names)]


def _literal_attribute(node: ast.AST) -> tuple[ast.AST, str] | None:
    """`getattr(x, "name"...)`, `setattr(...)`, `hasattr(...)` -> (x, "name")."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[0], node.args[1].value
    return None


_WALKED: dict[int, tuple[ast.Module, list[ast.AST]]] = {}


def _nodes(tree: ast.Module) -> list[ast.AST]:
    """`ast.walk(tree)` as a list, walked once per tree (the scan reads each tree several times)."""
    if id(tree) not in _WALKED:
        _WALKED[id(tree)] = (tree, list(ast.walk(tree)))
    return _WALKED[id(tree)][1]


def package_names(sources: dict[str, ast.Module]) -> set[str]:
    """Every name trl_multiturn defines: functions, classes, class attributes and `x.name = ...` targets."""
    names = set()
    for tree in sources.values():
        for node in _nodes(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(
                        item, ast.AnnAssign) else []
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def package_assigned(sources: dict[str, ast.Module]) -> set[str]:
    """The attribute names trl_multiturn assigns on its own objects (`self.name = ...` or `obj.name = ...`)."""
    names = set()
    for tree in sources.values():
        for node in _nodes(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(element, ast.Attribute):
                        names.add(element.attr)
    return names


def trainer_attributes(classes) -> set[str]:
    """The attributes and methods of TRL's and transformers' trainer classes: defined on the class, or assigned as
    `self.name` anywhere in the source of a class of theirs in the MRO."""
    names = set()
    for cls in classes:
        names.update(dir(cls))
        for base in cls.__mro__:
            if not is_library(base.__module__):
                continue
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                        and isinstance(node.ctx, ast.Store)):
                    names.add(node.attr)
    return names


def read_sources(root: Path) -> dict[str, ast.Module]:
    """The parsed modules of the package under `root`, by path (`trl_multiturn/...`)."""
    return {str(path.relative_to(root.parent)): ast.parse(path.read_text(), str(path))
            for path in sorted(root.rglob("*.py"))}


def scan(sources: dict[str, ast.Module], trainer_names: set[str], trainer_public: set[str],
         public_modules: tuple[str, ...], is_public) -> list[Use]:
    """Every touch point in the package's `sources` (`read_sources`). `trainer_names`: `trainer_attributes(...)`;
    `is_public(module, name)`: whether `module` (one of `public_modules`) exports `name`."""
    defined = package_names(sources)
    ours = defined | package_assigned(sources)
    uses = []
    for where, tree in sources.items():
        aliases = {}  # local name -> library module, for `import a.b as m` / `import a.b`
        library_names = set()  # local names bound by `from <library module> import name`
        for node in _nodes(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if is_library(alias.name):
                        aliases[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level and is_library(node.module):
                library_names.update(alias.asname or alias.name for alias in node.names)
                for alias in node.names:
                    if node.module not in public_modules or not is_public(node.module, alias.name) or (
                            alias.name.startswith("_")):
                        uses.append(Use("import", node.module, alias.name, where=where))
        trainer_side = _trainer_side_nodes(tree)
        bases = {id(node.value) for node in _nodes(tree) if isinstance(node, ast.Attribute)}
        for node in _nodes(tree):
            # a library module passed around whole (`helper(trl_grpo)`): what is done with it is not visible here
            if (isinstance(node, ast.Name) and node.id in aliases and id(node) not in bases
                    and aliases[node.id] not in public_modules and isinstance(node.ctx, ast.Load)):
                uses.append(Use("module", aliases[node.id], "*", where=where))
            literal = _literal_attribute(node)
            if isinstance(node, ast.Attribute):
                chain, assigned = _chain(node), isinstance(node.ctx, ast.Store)
            elif literal is not None:
                chain = [_chain(literal[0])[-1] if isinstance(literal[0], ast.Attribute) else getattr(
                    literal[0], "id", ""), literal[1]]
                assigned = node.func.id in ("setattr", "delattr")
            else:
                continue
            # `m.name` of a library module alias (the longest dotted prefix that is one)
            joined = ".".join(chain)
            for alias, module in aliases.items():
                if joined.startswith(alias + ".") and len(chain) > alias.count(".") + 1:
                    name = chain[alias.count(".") + 1]
                    if module not in public_modules or not is_public(module, name) or name.startswith("_"):
                        if not name.startswith("__"):
                            uses.append(Use("module", module, name, assigned, where))
                    break
            else:
                uses.extend(_attribute_uses(chain, assigned, where, defined, ours, trainer_names, trainer_public,
                                            id(node) in trainer_side, library_names))
    return sorted(set(uses), key=lambda u: (u.where, u.kind, u.module, u.name))


def _attribute_uses(chain, assigned, where, defined, ours, trainer_names, trainer_public, trainer_side,
                    library_names):
    """The touch points of one attribute chain `base.a.b...`: the first library state or private name in it (with
    the attribute after it, if any)."""
    for i, name in enumerate(chain[1:], start=1):
        further = f"{name}.{chain[i + 1]}" if i + 1 < len(chain) else None
        if name.startswith("__"):
            continue
        if (i == 1 and trainer_side and chain[0] in ("self", "trainer", "super()") and name in trainer_names
                and name not in trainer_public):
            return [Use("state", "", further or name, assigned and further is None, where)]
        if name.startswith("_") and name not in PYTHON_UNDERSCORE and (
                (i == 1 and chain[0] in library_names) or name not in defined and name not in ours):
            return [Use("private", "", further or name, assigned and further is None, where)]
    return []


def _trainer_side_nodes(tree: ast.Module) -> set[int]:
    """The nodes inside trl_multiturn's trainer-side code: classes named `*Trainer` or `*Mixin`, and functions with a
    parameter named `trainer`."""
    nodes = set()
    for node in _nodes(tree):
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Trainer", "Mixin")) or (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and any(a.arg == "trainer" for a in node.args.args + node.args.kwonlyargs)):
            nodes.update(id(child) for child in ast.walk(node))
    return nodes



