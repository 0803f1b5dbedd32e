"""Compares the committed libfabric bindings with ones bindgen generated from another libfabric's
headers (scripts/test-libfabric2.sh): every constant, type alias, struct and function the Rust
sources use must be the same in both, else the committed bindings would misread that libfabric.

    python scripts/compare_bindings.py COMMITTED.rs GENERATED.rs SOURCE_DIR

Exits 1 listing each item that differs (a value, a field, a signature) or is missing."""

import re
import sys
from pathlib import Path

ITEM = re.compile(
    r"^pub (?:const|static) (?P<c>\w+):[^=]+=\s*(?P<cv>[^;]+);"
    r"|^pub type (?P<t>\w+)\s*=\s*(?P<tv>[^;]+);"
    r"|^pub (?:struct|union) (?P<s>\w+)\s*\{(?P<sv>.*?)^\}"
    r"|^\s*pub fn (?P<f>\w+)\s*(?P<fv>\(.*?\)(?:\s*->\s*[^;]+)?);",
    re.M | re.S,
)


def items(path: str) -> dict[str, str]:
    """Name -> definition with whitespace normalised, for every top-level item of a bindings file."""
    found = {}
    for m in ITEM.finditer(Path(path).read_text()):
        name = next(m.group(k) for k in ("c", "t", "s", "f") if m.group(k))
        body = next(m.group(k) for k in ("cv", "tv", "sv", "fv") if m.group(k) is not None)
        found[name] = " ".join(body.split())
    return found


def used_names(source_dir: str, known: set[str]) -> set[str]:
    """The bindings' names that appear as words in the Rust sources (what pyddstore relies on;
    bindings.rs itself excluded)."""
    words = set()
    for path in Path(source_dir).rglob("*.rs"):
        if path.name != "bindings.rs":
            words |= set(re.findall(r"\b\w+\b", path.read_text()))
    return words & known


FIELD = re.compile(r"pub (\w+): (.+?),(?= pub |$)")


def fields(body: str) -> list[tuple[str, str]]:
    return FIELD.findall(body)


def compatible(name: str, old: dict[str, str], new: dict[str, str]) -> str | None:
    """None when the committed item reads the generated one correctly, else why not. A struct
    may have grown at its end (libfabric copies structs by the API version pyddstore requests,
    FI_API_VERSION, so it never writes the newer fields); a field may have become a member of an
    anonymous union of the same size (bindgen's `__bindgen_anon_N`); an opaque committed struct
    (`_unused`) is only ever used behind a pointer."""
    if name not in new:
        return "missing from the generated bindings"
    a, b = old[name], new[name]
    if a == b or a.startswith("_unused:"):
        return None
    fa, fb = fields(a), fields(b)
    if not fa or len(fb) < len(fa):
        return f"differs:\n  committed: {a}\n  generated: {b}"
    for (na, ta), (nb, tb) in zip(fa, fb):
        if (na, ta) == (nb, tb):
            continue
        anon = re.fullmatch(r"\w+__bindgen_ty_\d+", tb)
        if nb.startswith("__bindgen_anon_") and anon and (na, ta) in fields(new.get(tb, "")):
            continue  # now one member of a union in the same place
        if na == nb and anon and re.fullmatch(r"\w+__bindgen_ty_\d+", ta):
            why = compatible_union(old.get(ta, ""), new.get(tb, ""))
            if why is None:
                continue
        return f"field {na}: {ta} became {nb}: {tb}"
    return None


def compatible_union(a: str, b: str) -> str | None:
    """An anonymous union (renamed by bindgen) holding at least the committed members."""
    return None if set(fields(a)) <= set(fields(b)) else "union members differ"


def main(committed: str, generated: str, source_dir: str) -> int:
    old, new = items(committed), items(generated)
    used = used_names(source_dir, set(old))
    # A used struct depends on its fields' types too (layout): follow them.
    todo = list(used)
    while todo:
        for word in re.findall(r"\b\w+\b", old.get(todo.pop(), "")):
            if word in old and word not in used:
                used.add(word)
                todo.append(word)
    problems, grown = [], []
    for name in sorted(used):
        if name.endswith(tuple(f"__bindgen_ty_{i}" for i in range(1, 10))):
            continue  # checked through the struct holding it
        why = compatible(name, old, new)
        if why:
            problems.append(f"{name}: {why}")
        elif old[name] != new[name] and not old[name].startswith("_unused:"):
            grown.append(name)
    print(f"compared {len(used)} items the sources use ({len(old)} committed, {len(new)} generated)")
    if grown:
        print(f"grown at the end or by an anonymous union, read correctly at API 1.17: {', '.join(grown)}")
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
