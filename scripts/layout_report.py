#!/usr/bin/env python
"""The package's shape as JSON: modules and lines per folder (each folder a layer of
docs/architecture.md), modules over 400 lines, the longest functions, and import cycles (imports
inside functions counted, as ``../shared/tools/import_cycles.py`` counts them).

    python scripts/layout_report.py [--top 15]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_layers import cycles, graph  # noqa: E402  (the layer test's own import graph)
from test_layout import sizes  # noqa: E402  (the size test's own counting)


def report(top: int) -> dict:
    package = ROOT / "nmt"
    folders: dict[str, dict] = defaultdict(lambda: {"modules": 0, "lines": 0})
    over, functions = {}, []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        folder = rel.parts[0] if len(rel.parts) > 1 else "."
        measured = sizes(path)
        folders[folder]["modules"] += 1
        folders[folder]["lines"] += measured["module"]
        if measured["module"] > 400:
            over[str(rel)] = measured["module"]
        functions += [(n, f"{rel}:{k}") for k, n in measured.items() if k != "module"]
    functions.sort(reverse=True)
    return {
        "modules": sum(f["modules"] for f in folders.values()),
        "lines": sum(f["lines"] for f in folders.values()),
        "folders": dict(sorted(folders.items())),
        "modules_over_400_lines": dict(sorted(over.items(), key=lambda kv: -kv[1])),
        "functions_over_60_lines": sum(n > 60 for n, _ in functions),
        "longest_functions": {name: n for n, name in functions[:top]},
        "import_cycles": cycles(graph()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="how many of the longest functions")
    print(json.dumps(report(parser.parse_args().top), indent=1))


if __name__ == "__main__":
    main()
