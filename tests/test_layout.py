"""The package's shape stays readable: modules of at most 400 lines and functions of at most 60,
or a one-line ``# Size:`` reason at the top of the file (after its docstring)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nmt"


def oversized(path: Path) -> list[str]:
    """What in ``path`` is over the limits: the module's line count and each function's, if over."""
    text = path.read_text(encoding="utf-8")
    over = [f"{text.count(chr(10))} lines"] if text.count("\n") > 400 else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
            over.append(f"{node.name}() {node.end_lineno - node.lineno + 1} lines")
    return over


def has_reason(path: Path) -> bool:
    """Whether a ``# Size:`` line follows the module docstring (before the first import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    first_code = next((n.lineno for n in tree.body if not isinstance(n, ast.Expr)), 10**9)
    lines = path.read_text(encoding="utf-8").splitlines()[: first_code - 1]
    return any(line.startswith("# Size: ") and len(line) > 20 for line in lines)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_is_small_or_says_why(path):
    assert not oversized(path) or has_reason(path), f"{path.name}: {', '.join(oversized(path))}; split it, or say why at the top ('# Size: ...')"


def test_the_check_sees_a_long_function_and_a_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    long = tmp_path / "m.py"
    long.write_text(f'"""Doc."""\n\nimport os\n\n\ndef f():\n{body}\n', encoding="utf-8")
    assert oversized(long) == ["f() 61 lines"] and not has_reason(long)
    long.write_text(f'"""Doc."""\n\n# Size: f() is one table of sixty values.\n\nimport os\n\n\ndef f():\n{body}\n', encoding="utf-8")
    assert has_reason(long)
