"""docs/contract.md matches the code: every public class, function, method, property and
parameter of pyddstore.torch (from inspect.signature) and every setting of the settings table
(pyddstore.Settings) appears there; method= takes pyddstore.Method names in any case; shapes and
dtypes have a form that is the same for every sample kind (field_shapes, field_dtypes)."""

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = ROOT / "docs" / "contract.md"

# How the contract names an instance of each class in `obj.member` lines.
INSTANCE = {
    "DistDataset": "ds",
    "DistDatasetReader": "ds",
    "ThreadDataLoader": "loader",
    "DistributedSampler": "sampler",
    "WindowedDataset": "windows",
    "FileComm": "comm",
    "RaggedRows": "rows",
    "Buffers": "bufs",
}
# DataLoader's own hook, overridden (not an API of its own).
NOT_API = {"check_worker_number_rationality"}


def _params(sig: inspect.Signature, drop_first: bool) -> str:
    """`(a, b=None, *, c=None, **kwargs)`: names and defaults, as the contract writes them."""
    out, starred = [], False
    params = list(sig.parameters.values())[1 if drop_first else 0 :]
    for p in params:
        if p.kind == p.KEYWORD_ONLY and not starred:
            out.append("*")
            starred = True
        if p.kind == p.VAR_POSITIONAL:
            out.append("*" + p.name)
            starred = True
        elif p.kind == p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            out.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return "(" + ", ".join(out) + ")"


def _public_api() -> list[tuple[str, str]]:
    """(what, how the contract must write it) for every public callable and property."""
    import pyddstore.torch as pt

    found = []
    for name in pt.__all__:
        obj = getattr(pt, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            found.append((name, name))
            continue
        found.append((name, name + _params(inspect.signature(obj), drop_first=False)))
        if not inspect.isclass(obj):
            continue
        for cls in obj.__mro__:
            if not cls.__module__.startswith("pyddstore"):
                continue  # torch's own Dataset/DataLoader members
            for member, value in vars(cls).items():
                if (member.startswith("_") and member != "__getitems__") or member in NOT_API:
                    continue
                if isinstance(value, (classmethod, staticmethod)):
                    sig = inspect.signature(getattr(obj, member))
                    found.append((f"{name}.{member}", f"{name}.{member}{_params(sig, False)}"))
                elif callable(value):
                    sig = _params(inspect.signature(value), drop_first=True)
                    found.append((f"{name}.{member}", f"{INSTANCE[name]}.{member}{sig}"))
                else:  # a property or a field
                    found.append((f"{name}.{member}", f"{INSTANCE[name]}.{member}"))
    return found


def _normal(text: str) -> str:
    """Whitespace, line breaks and trailing commas do not matter; quotes are one kind."""
    text = re.sub(r"\s+", " ", text).replace('"', "'")
    text = re.sub(r"\s*([,=])\s*", r"\1", text)  # not around words, nor after a ")"
    text = re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))
    return text.replace(",)", ")")


def test_contract_shows_every_public_signature():
    doc = _normal(CONTRACT.read_text())
    missing = []
    for what, written in _public_api():
        if not re.search(r"(?<![\w.])" + re.escape(_normal(written)) + r"(?![\w(])", doc):
            missing.append(f"{what}: {written}")
    assert not missing, "docs/contract.md lacks (or shows another signature of):\n" + "\n".join(missing)


def test_contract_lists_every_setting():
    import pyddstore

    doc = CONTRACT.read_text()
    names = [f"DDSTORE_{key.upper()}" for key in pyddstore.Settings.from_env().as_dict()]
    assert len(names) > 30, names
    missing = [n for n in names if not re.search(rf"`{n}`", doc)]
    assert not missing, f"docs/contract.md's settings table lacks {missing}"


def test_method_takes_the_names_of_pyddstore_method_in_any_case():
    import pyddstore
    from pyddstore import _native

    for member in pyddstore.Method:
        for spelling in (member.name, member.name.lower(), member.name.title(), member, int(member)):
            assert _native.check_method(spelling) == int(member), spelling
            assert pyddstore.Settings.from_env(method=spelling).method == int(member), spelling
    store = pyddstore.PyDDStore(None, method="libfabric")
    assert store.method == pyddstore.Method.LIBFABRIC == 1
    store.free()
    for bad in ("fabric", "", True, 1.5, "3"):
        with pytest.raises(pyddstore.DDStoreValueError, match="method="):
            _native.check_method(bad)
    with pytest.raises(pyddstore.DDStoreValueError, match="LIBFABRIC_EXTRA_JOBS"):
        pyddstore.PyDDStore(None, method="LIBFABRIC-EXTRA")


def test_field_shapes_and_dtypes_are_a_dict_for_every_sample_kind(monkeypatch):
    pytest.importorskip("torch")
    from pyddstore.torch import DistDataset

    from pyddstore import Settings

    monkeypatch.setenv("FI_TCP_IFACE", "lo")
    quiet = Settings.from_env(quiet=True)
    img = np.arange(6 * 2 * 3, dtype=np.float32).reshape(6, 2, 3)
    label = np.arange(6, dtype=np.int64)
    sources = {
        "one": (img, (2, 3), "float32", {0: (2, 3)}, {0: "float32"}),
        "tuple": (
            [(img[i], int(label[i])) for i in range(6)],
            ((2, 3), ()),
            ("float32", "int64"),
            {0: (2, 3), 1: ()},
            {0: "float32", 1: "int64"},
        ),
        "dict": (
            [{"x": img[i], "y": int(label[i])} for i in range(6)],
            {"x": (2, 3), "y": ()},
            {"x": "float32", "y": "int64"},
            {"x": (2, 3), "y": ()},
            {"x": "float32", "y": "int64"},
        ),
    }
    for kind, (src, shapes, dtypes, field_shapes, field_dtypes) in sources.items():
        ds = DistDataset(src, f"contract_{kind}", method="LIBFABRIC", settings=quiet)
        try:
            assert ds.shapes == shapes and ds.dtypes == dtypes, (kind, ds.shapes, ds.dtypes)
            assert ds.field_shapes == field_shapes and ds.field_dtypes == field_dtypes, kind
            rows = ds.read_rows([5, 0])
            assert list(rows) == list(ds.field_shapes) == ds.fields, (kind, list(rows))
            for key, shape in ds.field_shapes.items():
                assert rows[key].shape == (2, *shape), (kind, key, rows[key].shape)
            first = rows[0] if kind != "dict" else rows["x"]
            assert np.array_equal(np.asarray(first), img[[5, 0]]), kind  # the stored rows
        finally:
            ds.free()
