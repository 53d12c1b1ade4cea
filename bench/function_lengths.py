"""The longest functions in a source tree, by lines (decorators and docstring included). Prints a table.

    $ .venv/bin/python bench/function_lengths.py                 # exporter/, functions over 60 lines
    $ .venv/bin/python bench/function_lengths.py exporter/guard --over 40

A function's length is from its first decorator (or `def`) to its last line, as `ast` gives them; a nested
function counts inside its parent and on its own.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lengths(root: Path) -> list[tuple[int, str]]:
    """(lines, `path:line name`) of every function under `root`, longest first."""
    out: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                end = node.end_lineno or node.lineno
                name = path.relative_to(root.parent) if root.parent in path.parents else path
                out.append((end - first + 1, f"{name}:{node.lineno} {node.name}"))
    return sorted(out, key=lambda x: (-x[0], x[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=str(ROOT / "exporter"))
    parser.add_argument("--over", type=int, default=60, help="list the functions longer than this many lines")
    args = parser.parse_args()
    found = lengths(Path(args.root).resolve())
    long = [(n, where) for n, where in found if n > args.over]
    print(f"{len(long)} functions over {args.over} lines in {args.root}")
    print("| lines | function |\n|---|---|")
    for n, where in long:
        print(f"| {n} | `{where}` |")


if __name__ == "__main__":
    main()
