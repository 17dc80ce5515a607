"""The house's rules, checked on the code itself: no import circles, each stage imports only the stages
before it, and docs/ARCHITECTURE.md's tree names every module there is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "elmo_cache"
# The pipeline's stages in the order they may import each other (a stage imports only those before it).
STAGES = ("text", "model", "encoder", "store", "rows", "builder", "reader", "verify", "compat", "train")
# Modules at the package root that every stage may use.
FLOOR = {
    "elmo_cache.errors",
    "elmo_cache.threads",
    "elmo_cache.version",
    "elmo_cache._primitives",
    "elmo_cache.progress",
    "elmo_cache.lazy",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports, wherever the import stands (functions and TYPE_CHECKING too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            submodules = names & modules.keys()
            out |= submodules or {node.module}
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def test_no_module_imports_itself_back_through_others():
    graph = _graph()
    # The package's face (elmo_cache/__init__.py) imports lazily by name and is imported by none of its stages.
    graph.pop("elmo_cache")
    for targets in graph.values():
        targets.discard("elmo_cache")
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    assert circles == []


def test_each_stage_imports_only_the_stages_before_it():
    wrong = []
    for module, targets in _graph().items():
        stage = _stage(module)
        if stage is None:
            continue
        for target in targets:
            other = _stage(target)
            if target in FLOOR or other == stage:
                continue
            if other is None or STAGES.index(other) > STAGES.index(stage):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_architecture_doc_names_every_module_in_its_tree():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    tree = text.split("```", 2)[1]  # the document opens with the tree
    named = set(re.findall(r"^\s*([\w/]+\.py)\b", tree, flags=re.MULTILINE))
    listed = set()
    folder: list[str] = []
    for line in tree.splitlines():
        match = re.match(r"^(\s*)([\w]+/|[\w]+\.py)", line)
        if not match:
            continue
        depth = len(match.group(1)) // 2
        folder = folder[:depth]
        if match.group(2).endswith("/"):
            folder.append(match.group(2))
        else:
            listed.add("".join(folder) + match.group(2))
    assert named  # the tree is there
    actual = {
        str(path.relative_to(ROOT))
        for top in ("elmo_cache", "cli", "server")
        for path in (ROOT / top).rglob("*.py")
        if "bundled" not in path.parts
    }
    assert sorted(actual - listed) == [], "modules the tree does not name"
    assert sorted(listed - actual) == [], "the tree names modules that do not exist"


def test_no_module_takes_another_modules_private_names_nor_another_packages_private_modules():
    installed = {"elmo_cache": "elmo_cache", "cli": "elmo_cache.cli", "server": "elmo_cache.server"}
    taken = []
    for top, package in installed.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            here = ".".join((package, *path.relative_to(ROOT / top).parent.parts))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("elmo_cache"):
                    continue
                module = node.module or ""
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
                taken += [f"{path.relative_to(ROOT)}: {module}.{name}" for name in private]
                parent, _, last = module.rpartition(".")
                if last.startswith("_") and parent != here:
                    taken.append(f"{path.relative_to(ROOT)}: {module}")
    assert taken == []


def test_setup_cfg_lists_every_package_so_a_wheel_carries_every_module():
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    listed = set(config["options"]["packages"].split())
    installed = {"elmo_cache": PACKAGE, "elmo_cache.cli": ROOT / "cli", "elmo_cache.server": ROOT / "server"}
    actual = set()
    for name, folder in installed.items():
        for init in folder.rglob("__init__.py"):
            actual.add(".".join((name, *init.parent.relative_to(folder).parts)))
    assert sorted(actual ^ listed) == []
