"""The package's shape stays readable: modules of at most 400 lines and functions of at most 60
lines of code (what follows the signature and docstring: a Typer command declares its options in its
signature, and a docstring is read as documentation), or a ``# Size:`` note at the top of the file
(after its docstring) whose numbers are checked against the file: ``# Size: module at most N lines,
name() at most M: why``. Each claim is a ceiling the file must stay under and within a tenth of (a
note that outgrew its file is out of date too), and every module or function over its limit needs
one. Lines are counted as formatted at 100 columns (``ruff format``)."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nmt"
MODULE_LINES, FUNCTION_LINES = 400, 60
CLAIM = re.compile(r"(module|\w+\(\)) at most (\d+)")


def sizes(path: Path) -> dict[str, int]:
    """The module's line count (as ``module``) and each function's lines of code (as ``name()``):
    from its first statement after the docstring to its end."""
    text = path.read_text(encoding="utf-8")
    found = {"module": text.count("\n")}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            start = body[0].lineno if body else node.end_lineno
            found[f"{node.name}()"] = max(
                found.get(f"{node.name}()", 0), node.end_lineno - start + 1
            )
    return found


def oversized(path: Path) -> dict[str, int]:
    """What in ``path`` is over the limits, with its size."""
    return {
        k: v
        for k, v in sizes(path).items()
        if v > (MODULE_LINES if k == "module" else FUNCTION_LINES)
    }


def claims(path: Path) -> dict[str, int]:
    """The ceilings the ``# Size:`` note (between the docstring and the first import) states."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    first_code = next((n.lineno for n in tree.body if not isinstance(n, ast.Expr)), 10**9)
    lines = path.read_text(encoding="utf-8").splitlines()[: first_code - 1]
    start = next((i for i, line in enumerate(lines) if line.startswith("# Size: ")), len(lines))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("#")), len(lines))
    note = " ".join(line.removeprefix("#").strip() for line in lines[start:end])
    return {what: int(n) for what, n in CLAIM.findall(note)}


def problems(path: Path) -> list[str]:
    """Each oversized part without a true claim, and each claim that is false, out of date or
    unneeded."""
    over, stated, actual = oversized(path), claims(path), sizes(path)
    found = [
        f"{k} has {v} lines and no '# Size: {k} at most N' note; split it along a real seam, or "
        "say why"
        for k, v in over.items()
        if k not in stated
    ]
    for what, ceiling in stated.items():
        if what not in over:
            found.append(
                f"the note claims {what} at most {ceiling}, but it is within the limit "
                f"({actual.get(what, 'absent')}): drop the claim"
            )
        elif not over[what] <= ceiling <= over[what] * 1.1:
            found.append(
                f"the note claims {what} at most {ceiling}; it has {over[what]} lines: state the "
                "size as it is"
            )
    return found


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_a_module_is_small_or_its_size_note_is_true(path):
    assert problems(path) == []


def test_the_check_sees_a_long_function_and_checks_the_note(tmp_path):
    # 61 lines of code after a 3-line signature and a 3-line docstring, which are not counted.
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    head = 'def f(\n    a=1,\n):\n    """Doc\n    of f.\n    """\n'
    long = tmp_path / "m.py"

    def write(note: str) -> list[str]:
        long.write_text(f'"""Doc."""\n\n{note}\nimport os\n\n\n{head}{body}\n', encoding="utf-8")
        return problems(long)

    write("")  # 6 lines before the function, 6 of its head, 61 of code
    assert sizes(long) == {"module": 73, "f()": 61}
    assert write("") == [
        "f() has 61 lines and no '# Size: f() at most N' note; split it along a real seam, or say "
        "why"
    ]
    assert write("# Size: f() at most 62 lines: one table of sixty values.") == []
    assert write("# Size: f() at most 60 lines: one table.") == [
        "the note claims f() at most 60; it has 61 lines: state the size as it is"
    ]
    assert write("# Size: f() at most 90 lines: one table.") == [
        "the note claims f() at most 90; it has 61 lines: state the size as it is"
    ]
    assert write("# Size: f() at most 62, module at most 500: one table.") == [
        "the note claims module at most 500, but it is within the limit (73): drop the claim"
    ]
    # A note's claims may run over its comment lines; the first line of code ends it.
    assert write("# Size: module at most 74 lines, f()\n# at most 62: one table.") == [
        "the note claims module at most 74, but it is within the limit (74): drop the claim"
    ]
    assert write("# Size: one table.\n\n# f() at most 62") == [
        "f() has 61 lines and no '# Size: f() at most N' note; split it along a real seam, or say "
        "why"
    ]
