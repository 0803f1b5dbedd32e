"""Writes scripts/constraints.txt: the versions of what scripts/setup.sh installs, and of their
dependencies, as installed in the running environment (the one CI was green with).

    .venv/bin/python scripts/freeze_constraints.py   # after upgrading on purpose; commit the result

scripts/setup.sh installs with `pip install -c scripts/constraints.txt`, so a fresh machine gets
these versions, not whatever was released since."""

import re
import sys
from importlib import metadata
from pathlib import Path

# The pip names scripts/setup.sh installs (its `want` list, import names mapped to pip names).
ROOTS = [
    "numpy", "mpi4py", "maturin", "pytest", "ruff", "matplotlib", "h5py", "zarr", "tqdm",
    "mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "torch", "torch_geometric",
]  # fmt: skip


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots):
    """Every installed distribution the roots need (extras' requirements left out)."""
    seen, todo = {}, [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist.version
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(canonical(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]))
    return seen


def main() -> None:
    pins = closure(ROOTS)
    out = Path(__file__).with_name("constraints.txt")
    lines = [
        "# Versions scripts/setup.sh installs (pip install -c scripts/constraints.txt): what CI was green",
        "# with. Regenerate on purpose after upgrading: .venv/bin/python scripts/freeze_constraints.py",
        f"# (Python {sys.version_info.major}.{sys.version_info.minor}).",
        *(f"{name}=={version}" for name, version in sorted(pins.items())),
    ]
    out.write_text("\n".join(lines) + "\n")
    print(f"{out}: {len(pins)} pins")


if __name__ == "__main__":
    main()
