"""Checks `pyddstore/_native.pyi` against the built extension `pyddstore._native`.

Every public name of the module and of each of its classes must be in the stub,
and every name in the stub must exist in the module, with the same kind
(class, function, property, constant). Every function, method and class
constructor the stub declares has the module's signature (from pyo3's
`__text_signature__`): the same parameters, in order, of the same kind, with
the same defaults (annotations are the stub's alone). The classes the API reference renders
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


def stub_signature(node: ast.FunctionDef) -> list[tuple[str, str, str | None]]:
    """A stub function's parameters as (name, kind, default source), `self` left out."""
    a = node.args
    params: list[tuple[str, str, str | None]] = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append((arg.arg, kind, default))
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append((arg.arg, "KEYWORD_ONLY", None if default is None else ast.unparse(default)))
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return [p for p in params if p[0] != "self"]


def runtime_signature(value: object) -> list[tuple[str, str, str | None]] | None:
    """The module's parameters of a function, method or class (None: pyo3 gave no signature)."""
    try:
        sig = inspect.signature(value)
    except (TypeError, ValueError):
        return None
    return [
        (p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
        for p in sig.parameters.values()
        if p.name != "self"
    ]


def shown(params: list[tuple[str, str, str | None]] | None) -> str:
    if params is None:
        return "(no signature)"
    parts = []
    for name, kind, default in params:
        star = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        parts.append(f"{star}{name}" + ("" if default is None else f"={default}"))
    return "(" + ", ".join(parts) + ")"


def compare_signatures(
    where: str, body: list[ast.stmt], actual: dict[str, object], owner: object = None
) -> list[str]:
    """Each function the stub body declares against the module's signature of it."""
    problems = []
    for node in body:
        if not isinstance(node, ast.FunctionDef) or (node.name not in actual and node.name != "__init__"):
            continue
        decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
        if "property" in decorators:
            continue
        if node.name == "__init__":
            if owner is None:
                continue
            runtime = runtime_signature(owner)  # the class's own signature: its `#[new]`
        else:
            runtime = runtime_signature(getattr(owner, node.name) if owner is not None else actual[node.name])
        stub = stub_signature(node)
        if runtime is None or stub != runtime:
            problems.append(
                f"{where}{node.name}: the stub's signature {shown(stub)}"
                f" differs from the module's {shown(runtime)}"
            )
    if owner is not None and "__init__" not in {n.name for n in body if isinstance(n, ast.FunctionDef)}:
        runtime = runtime_signature(owner)
        if runtime is not None:
            problems.append(f"{where}__init__: in the module {shown(runtime)}, missing from the stub")
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
    problems += compare_signatures("_native.", tree.body, actual)
    documented = documented_classes()
    for name in sorted(documented - set(declared)):
        problems.append(f"_native.{name}: in the API reference, missing from the stub")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in actual:
            cls = actual[node.name]
            members = {n: v for n, v in vars(cls).items()}
            problems += compare(f"_native.{node.name}.", stub_names(node.body), members)
            problems += compare_signatures(f"_native.{node.name}.", node.body, members, cls)
            if node.name in documented:
                problems += compare_docstrings(node, cls)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{STUB}: {len(problems)} difference(s) from the built module", file=sys.stderr)
        return 1
    print(f"{STUB.name} matches pyddstore._native ({len(declared)} names, names and signatures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
