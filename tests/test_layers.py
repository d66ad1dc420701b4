"""The layer table of docs/architecture.md is the package's import graph: every import of every
module (inside functions and ``if TYPE_CHECKING`` blocks too) points to its own layer or one below,
and there is no cycle."""

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nmt"


def layer_table(text: str) -> list[tuple[str, list[str], list[str] | None]]:
    """The ```layers block of ``text``: (layer, module patterns, ``only`` patterns or None), top
    layer first."""
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    table = []
    for line in block.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, *rest = line.split()
        only = rest[rest.index("only") + 1 :] if "only" in rest else None
        table.append((name, rest[: rest.index("only")] if only is not None else rest, only))
    return table


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The nmt modules ``path`` imports, anywhere in the file (a name imported from a package counts
    as that module when it is one)."""
    name, package = module_name(path), path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "nmt"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "nmt":
                continue
            found.add(target)
            for alias in node.names:  # `from . import evaluate`: the module nmt.scoring.evaluate
                candidate = f"{target}.{alias.name}"
                if (ROOT / Path(*candidate.split("."))).with_suffix(".py").is_file() or (
                    ROOT / Path(*candidate.split(".")) / "__init__.py"
                ).is_file():
                    found.add(candidate)
    return found - {name}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str, table) -> int:
    matches = [
        i
        for i, (_, patterns, _) in enumerate(table)
        if any(fnmatch.fnmatchcase(module, p) for p in patterns)
    ]
    assert len(matches) == 1, (
        f"{module} is in {len(matches)} layers of docs/architecture.md; put it in exactly one"
    )
    return matches[0]


def violations(modules: dict[str, set[str]], table) -> list[str]:
    """Each import that points up the table or outside what ``only`` allows, as ``a -> b (why)``."""
    found = []
    for module, targets in modules.items():
        mine = layer_of(module, table)
        for target in sorted(targets):
            theirs = layer_of(target, table)
            if theirs < mine:  # the table lists the top layer first
                found.append(
                    f"{module} -> {target} (up from {table[mine][0]} to {table[theirs][0]})"
                )
            only = table[mine][2]
            if (
                theirs > mine
                and only is not None
                and not any(fnmatch.fnmatchcase(target, p) for p in only)
            ):
                found.append(
                    f"{module} -> {target} ({table[mine][0]} takes only {', '.join(only)} from "
                    "below)"
                )
    return found


def cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in modules.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(modules):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def table():
    return layer_table((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))


def test_every_import_points_to_its_own_layer_or_below(table):
    assert violations(graph(), table) == []


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def test_the_core_imports_nothing_but_itself_and_its_settings():
    core = {m: t for m, t in graph().items() if m.startswith("nmt.core")}
    assert {t for targets in core.values() for t in targets if not t.startswith("nmt.core")} <= {
        "nmt.config"
    }


def test_the_checks_see_an_upward_import_a_cycle_and_a_function_level_import(tmp_path):
    table = layer_table("```layers\ntop   a b\nlow   c    only d\nbase  d e\n```\n")
    assert [name for name, _, _ in table] == ["top", "low", "base"] and table[1][2] == ["d"]
    assert violations({"c": {"a"}}, table) == ["c -> a (up from low to top)"]
    assert violations({"c": {"e"}}, table) == ["c -> e (low takes only d from below)"]
    assert violations({"a": {"c", "d"}, "c": {"d"}, "d": {"e"}}, table) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = tmp_path / "m.py"
    source.write_text(
        "import os\n\n\ndef f():\n    from nmt.files import atomic_write\n    import nmt.config\n",
        encoding="utf-8",
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert imports(source) == {"nmt.files", "nmt.config"}
    finally:
        ROOT = saved


def folder_problems(table, package: Path) -> list[str]:
    """Where the tree does not show the table: a layer but the foundations that is not exactly
    the folder of its name (``nmt.X nmt.X.*``; the command line also holds ``nmt.__main__``), a
    layer's folder missing or without its package docstring, a folder no layer names, or a module
    outside every folder that is not a foundation."""
    found = []
    foundations = next(patterns for name, patterns, _ in table if name == "foundations")
    layers = {name: patterns for name, patterns, _ in table if name != "foundations"}
    for name, patterns in layers.items():
        expected = [f"nmt.{name}", f"nmt.{name}.*"] + (["nmt.__main__"] if name == "cli" else [])
        if sorted(patterns) != sorted(expected):
            found.append(f"layer {name} is {' '.join(patterns)}, not the folder nmt/{name}/")
        init = package / name / "__init__.py"
        if not init.is_file() or not ast.get_docstring(ast.parse(init.read_text("utf-8"))):
            found.append(f"nmt/{name}/ has no __init__.py saying what the layer holds")
    for path in sorted(p for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if path.name not in layers and any(path.glob("*.py")):
            found.append(f"nmt/{path.name}/ is in no layer of the table")
    for path in sorted(package.glob("*.py")):
        name = "nmt" if path.stem == "__init__" else f"nmt.{path.stem}"
        if name not in foundations and name != "nmt.__main__":
            found.append(f"{path.name} sits at the top but is no foundation: move it to its layer")
    return found


def test_each_layer_is_a_folder_and_the_top_holds_only_the_foundations(table):
    assert folder_problems(table, PACKAGE) == []


def test_the_folder_check_sees_a_stray_module_and_a_layer_without_its_folder(tmp_path):
    package = tmp_path / "nmt"
    (package / "data").mkdir(parents=True)
    (package / "data" / "__init__.py").write_text('"""Text in."""\n')
    (package / "extra").mkdir()
    (package / "extra" / "x.py").write_text("")
    for name in ("__init__.py", "config.py", "stray.py"):
        (package / name).write_text("")
    table = layer_table(
        "```layers\ndata  nmt.data nmt.data.*\nruns  nmt.runs nmt.runs.* nmt.train\n"
        "foundations  nmt nmt.config\n```\n"
    )
    assert folder_problems(table, package) == [
        "layer runs is nmt.runs nmt.runs.* nmt.train, not the folder nmt/runs/",
        "nmt/runs/ has no __init__.py saying what the layer holds",
        "nmt/extra/ is in no layer of the table",
        "stray.py sits at the top but is no foundation: move it to its layer",
    ]
