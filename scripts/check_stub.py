"""Checks `pyddstore/_native.pyi` against the built extension `pyddstore._native`.

Every public name of the module and of each of its classes must be in the stub,
and every name in the stub must exist in the module, with the same kind
(class, function, property, constant). The classes the API reference renders
from `_native` (`::: pyddstore._native.X` in docs/reference/) carry the module's
docstrings in the stub, word for word, so that the reference renders from the
stub after any install (`pip install .` leaves no extension in the checkout).
Run by `scripts/run-tests.sh` and `make lint`; exits 1 listing every difference.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / "pyddstore" / "python" / "pyddstore" / "_native.pyi"


def documented_classes() -> set[str]:
    """The `_native` classes the API reference renders (docs/reference/*.md)."""
    names: set[str] = set()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        names |= set(re.findall(r"^::: pyddstore\._native\.(\w+)", page.read_text(), re.M))
    return names


def compare_docstrings(node: ast.ClassDef, cls: type) -> list[str]:
    """The class's and each public member's docstring in the stub against the module's."""
    where = f"_native.{node.name}"
    problems = []
    if ast.get_docstring(node) != inspect.getdoc(cls):
        problems.append(f"{where}: the stub's docstring differs from the module's")
    for member in node.body:
        if not isinstance(member, ast.FunctionDef) or member.name.startswith("_"):
            continue
        raw = vars(cls)[member.name]
        # a property's own doc; a method through the class (a staticmethod's is its function's)
        value = raw if inspect.isdatadescriptor(raw) else getattr(cls, member.name)
        want = inspect.getdoc(value)
        if ast.get_docstring(member) != want:
            problems.append(f"{where}.{member.name}: the stub's docstring differs from the module's:\n{want}")
    return problems


def stub_names(body: list[ast.stmt]) -> dict[str, str]:
    """Names a stub body declares, each with its kind."""
    names: dict[str, str] = {}
    for node in body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = "class"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
            names[node.name] = "property" if "property" in decorators else "function"
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = "constant"
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = "constant"
    return names


def kind_of(value: object) -> str:
    """The stub kind a runtime object corresponds to."""
    if inspect.isclass(value):
        return "class"
    if inspect.isdatadescriptor(value) or isinstance(value, property):
        return "property"
    if callable(value) or isinstance(value, (staticmethod, classmethod)):
        return "function"
    return "constant"


def public(names) -> set[str]:
    return {n for n in names if not n.startswith("_")}


def compare(where: str, declared: dict[str, str], actual: dict[str, object]) -> list[str]:
    problems = []
    for name in sorted(public(actual) - set(declared)):
        problems.append(f"{where}{name}: in the module, missing from the stub")
    for name in sorted(set(declared) - set(actual)):
        if not name.startswith("__"):
            problems.append(f"{where}{name}: in the stub, not in the module")
    for name in sorted(public(declared) & set(actual)):
        got = kind_of(actual[name])
        if got != declared[name]:
            problems.append(f"{where}{name}: the stub declares a {declared[name]}, the module has a {got}")
    return problems


def main() -> int:
    import pyddstore._native as native

    tree = ast.parse(STUB.read_text(), str(STUB))
    declared = stub_names(tree.body)
    actual = {n: getattr(native, n) for n in dir(native)}
    problems = compare("_native.", declared, actual)
    documented = documented_classes()
    for name in sorted(documented - set(declared)):
        problems.append(f"_native.{name}: in the API reference, missing from the stub")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in actual:
            cls = actual[node.name]
            members = {n: v for n, v in vars(cls).items()}
            problems += compare(f"_native.{node.name}.", stub_names(node.body), members)
            if node.name in documented:
                problems += compare_docstrings(node, cls)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{STUB}: {len(problems)} difference(s) from the built module", file=sys.stderr)
        return 1
    print(f"{STUB.name} matches pyddstore._native ({len(declared)} names)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
