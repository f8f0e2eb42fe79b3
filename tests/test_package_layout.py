"""The package's layout rules, read from its own imports with `ast` (docs/design.md, "Layout").

- no import circles between dociq modules (module-level imports);
- imports point down the layers: `io` < `data` < `models` < `training`, `inference` < `evaluation`,
  `engine` < `cli`, and `data` < `corpus` (the corpus builder) < `cli` (FORBIDDEN lists what each
  layer must not import; `evaluation` scores through the Predictor and imports nothing of
  `training`, so the lean install can evaluate);
- only `training` (and the optimizer's Lightning strategy) imports Lightning;
- every Hydra `_target_` naming a dociq object (in `dociq/configs/**/*.yaml`, and as a string
  literal in dociq's code, e.g. a config a module writes) names one in `data`, `models`, `training`
  or `optim`: what training builds from a config string is a layer it may import;
- no function longer than ~80 lines;
- a function-level import of a dociq module says why it is deferred (`# deferred: ...`).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

PACKAGE = Path(__file__).resolve().parents[1] / "dociq"
# layer -> the layers it must not import (the rest of dociq it may)
FORBIDDEN = {
    "dociq.io": ("dociq.data", "dociq.corpus", "dociq.models", "dociq.optim", "dociq.training",
                 "dociq.inference", "dociq.evaluation", "dociq.engine", "dociq.cli"),
    "dociq.data": ("dociq.corpus", "dociq.models", "dociq.optim", "dociq.training", "dociq.inference",
                   "dociq.evaluation", "dociq.engine", "dociq.cli"),
    # the corpus builder: above data (it writes the shards data reads), below cli (`dociq corpus`)
    "dociq.corpus": ("dociq.training", "dociq.inference", "dociq.evaluation", "dociq.engine", "dociq.cli"),
    "dociq.models": ("dociq.corpus", "dociq.optim", "dociq.training", "dociq.inference", "dociq.evaluation",
                     "dociq.engine", "dociq.cli"),
    "dociq.optim": ("dociq.data", "dociq.corpus", "dociq.models", "dociq.training", "dociq.inference",
                    "dociq.evaluation", "dociq.engine", "dociq.cli"),
    "dociq.training": ("dociq.corpus", "dociq.inference", "dociq.evaluation", "dociq.engine", "dociq.cli"),
    "dociq.inference": ("dociq.corpus", "dociq.training", "dociq.evaluation", "dociq.engine", "dociq.cli"),
    "dociq.evaluation": ("dociq.corpus", "dociq.training", "dociq.engine", "dociq.cli"),
    "dociq.engine": ("dociq.corpus", "dociq.training", "dociq.cli"),
}
LIGHTNING_ALLOWED = ("dociq.training", "dociq.optim.strategy", "dociq.optim.comm_hook")
# the layers a Hydra `_target_` may name (third-party targets, lightning.* or torch.*, are free)
TARGET_LAYERS = ("dociq.data", "dociq.models", "dociq.training", "dociq.optim")
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in MODULES.items()}


def owning_module(dotted: str) -> str | None:
    """The dociq module a dotted import name lands in (`dociq.a.b.Name` -> `dociq.a.b`)."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imports(name: str, tree: ast.Module):
    """(imported dotted name, node, inside a function?) for every import in a module."""
    def walk(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child, in_function
            elif isinstance(child, ast.ImportFrom) and child.module:
                names = [f"{child.module}.{alias.name}" for alias in child.names]
                # `from pkg import submodule` imports the submodule (the package's __init__ runs
                # first whatever the form, so it is not an edge of this module)
                if not all(name in MODULES for name in names):
                    yield child.module, child, in_function
                for name in names:
                    yield name, child, in_function
            yield from walk(child, nested)
    yield from walk(tree, False)


def dociq_edges(top_level_only: bool = True) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, tree in TREES.items():
        for dotted, _, in_function in imports(name, tree):
            if in_function and top_level_only:
                continue
            target = owning_module(dotted) if dotted.startswith("dociq") else None
            # a package's __init__ is where its submodules' names live: importing dociq.x.y
            # also runs dociq.x, but that is Python's doing, not an edge of this module
            if target and target != name and target != "dociq":
                edges[name].add(target)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def in_layer(name: str, layers: tuple[str, ...]) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


def test_the_rules_see_the_whole_package():
    assert {"dociq.inference.predictor", "dociq.training.train", "dociq.io.checkpoint"} <= set(MODULES)
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles_between_dociq_modules():
    cycle = find_cycle(dociq_edges(top_level_only=False))
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_point_down_the_layers(layer):
    offending = sorted(f"{name} imports {target}"
                       for name, targets in dociq_edges(top_level_only=False).items() if in_layer(name, (layer,))
                       for target in targets if in_layer(target, FORBIDDEN[layer]))
    assert not offending, "\n".join(offending)


def test_only_training_imports_lightning():
    offending = sorted({f"{name}: {dotted}" for name, tree in TREES.items()
                        for dotted, _, _ in imports(name, tree)
                        if dotted.split(".")[0] in ("lightning", "pytorch_lightning")
                        and not in_layer(name, LIGHTNING_ALLOWED)})
    assert not offending, "\n".join(offending)


def yaml_targets(node):
    """Every `_target_` string in a loaded YAML document."""
    if isinstance(node, dict):
        if isinstance(node.get("_target_"), str):
            yield node["_target_"]
        node = list(node.values())
    if isinstance(node, list):
        for child in node:
            yield from yaml_targets(child)


def config_targets() -> list[tuple[str, str]]:
    """(file[:line], target) for every `_target_` of the shipped configs and every `_target_`
    string literal in dociq's code (`{"_target_": "..."}` or `_target_="..."`)."""
    found = [(str(path.relative_to(PACKAGE.parent)), target)
             for path in sorted((PACKAGE / "configs").rglob("*.yaml"))
             for target in yaml_targets(yaml.safe_load(path.read_text()))]
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)]
            elif isinstance(node, ast.Call):
                pairs = [(kw.arg, kw.value) for kw in node.keywords]
            else:
                continue
            found += [(f"{MODULES[name].relative_to(PACKAGE.parent)}:{value.lineno}", value.value)
                      for key, value in pairs if key == "_target_"
                      and isinstance(value, ast.Constant) and isinstance(value.value, str)]
    return found


def test_config_targets_name_only_layers_training_may_build():
    """Training instantiates `_target_` strings, which the import rules cannot see: a config that
    named an engine or cli class would make training import a layer above it."""
    targets = config_targets()
    assert any(w.endswith(".yaml") for w, _ in targets) and any(".py:" in w for w, _ in targets)
    offending = sorted(f"{where}: {target}" for where, target in targets
                       if target.split(".")[0] == "dociq" and not in_layer(target, TARGET_LAYERS))
    assert not offending, (f"_target_s outside {', '.join(TARGET_LAYERS)}:\n" + "\n".join(offending))


def test_no_function_longer_than_the_limit():
    long = sorted(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
                  for name, tree in TREES.items() for node in ast.walk(tree)
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES)
    assert not long, "\n".join(long)


def test_function_level_imports_of_dociq_say_why():
    unexplained = []
    for name, tree in TREES.items():
        lines = MODULES[name].read_text().splitlines()
        seen = set()
        for dotted, node, in_function in imports(name, tree):
            if not in_function or not dotted.startswith("dociq") or id(node) in seen:
                continue
            seen.add(id(node))
            above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
            if "deferred:" not in above and "deferred:" not in lines[node.lineno - 1]:
                unexplained.append(f"{MODULES[name].relative_to(PACKAGE.parent)}:{node.lineno}: {dotted}")
    assert not unexplained, "function-level imports without a `# deferred: <reason>` comment:\n" + \
        "\n".join(unexplained)


def test_no_compatibility_layer_at_0x():
    """Old module paths are gone, not aliased (CHANGELOG.md lists them): importing dociq adds no
    import hook, and a moved module is found at its one path only."""
    import importlib.util
    import sys

    import dociq
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("dociq")]
    for old in ("dociq.predict", "dociq.tasks", "dociq.data.coco", "dociq.engine.cli",
                "dociq.data.datasets.corpus.build"):
        assert importlib.util.find_spec(old) is None, old
    assert dociq.Predictor is importlib.import_module("dociq.inference.predictor").Predictor
    with pytest.raises(AttributeError):
        importlib.import_module("dociq.data.synthetic").SyntheticDocuments


def test_command_line_parsing_lives_in_cli():
    """Every argparse of the package is in dociq/cli (CONTRIBUTING.md): a library module takes
    arguments, the command that reads them from a terminal is a cli module."""
    offenders = [str(path.relative_to(PACKAGE.parent)) for path in PACKAGE.rglob("*.py")
                 if "cli" not in path.relative_to(PACKAGE).parts[:1]
                 and re.search(r"^\s*(import argparse|from argparse import)", path.read_text(), re.M)]
    assert not offenders, f"argparse outside dociq/cli: {offenders}"
