"""Documentation: `mkdocs build --strict` (warnings are errors: broken links, missing pages,
API reference entries that do not resolve), every public name of pyddstore and
pyddstore.torch documented with an example, and nothing pointing outside the repository."""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_strict(tmp_path):
    """`mkdocs build --strict` as the README says (no `-q`: strict mode only fails on the warnings
    it is shown), with no WARNING line at all, and pages rendered as written."""
    pytest.importorskip("mkdocs", reason="the docs toolchain: bash scripts/setup.sh installs it")
    pytest.importorskip("mkdocstrings_handlers.python")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    reference = (site / "reference" / "torch" / "index.html").read_text()
    for name in ("DistDataset", "DistributedSampler", "read_rows", "ThreadDataLoader", "row_of"):
        assert name in reference, name
    _check_index_renders_the_quickstart(site)
    _check_reference_pages(site)


def _page_text(html: str) -> str:
    """The text of a built page: tags dropped, entities decoded (code is split into spans)."""
    import html as html_mod
    import re

    return html_mod.unescape(re.sub(r"<[^>]+>", "", html))


def _check_index_renders_the_quickstart(site: Path) -> None:
    index = _page_text((site / "index.html").read_text())
    assert "--8<--" not in index and "--8 <" not in index, "the snippet marker was not expanded"
    for line in (ROOT / "examples" / "quickstart.py").read_text().splitlines():
        if line.strip() and not line.startswith(('"""', " ")):
            assert line in index, f"docs/index.md does not show the quickstart line {line!r}"


def _check_reference_pages(site: Path) -> None:
    """Every public class in the reference, nothing private or torch's leaking in, parameter
    tables with types and defaults, signatures wrapped (by ruff, which mkdocstrings formats
    them with)."""
    store = _page_text((site / "reference" / "pyddstore" / "index.html").read_text())
    torch_page = _page_text((site / "reference" / "torch" / "index.html").read_text())
    for name in ("Settings", "DeviceShare", "from_env", "gather_own", "FileComm", "DDStoreStaleError"):
        assert name in store, name
    for page in (store, torch_page):
        for leak in ("_StoredDataset", "pyddstore._errors", "check_worker_number_rationality", "Bases:"):
            assert leak not in page, leak
    assert "DistDataset(\n    source,\n    name,\n" in torch_page, "DistDataset's signature is not wrapped"
    table = torch_page[torch_page.index("load_workers") :]
    assert "Parameters:" in torch_page and "str | None" in table and "None" in table


def test_figures_page_answers_its_questions_from_the_data():
    """docs/figures.md: each question's section has one plot drawn by docs/figures/plot.py, the
    table plot.py prints from the same data file, and a command; no hand-written numbers in tables."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location("figures_plot", ROOT / "docs" / "figures" / "plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    page = (ROOT / "docs" / "figures.md").read_text()
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    measured = [s for s in sections if "![" in s]
    assert len(measured) == len(plot.SECTIONS), [s.splitlines()[0] for s in sections]
    for name, section in zip(plot.SECTIONS, measured):
        title = section.splitlines()[0]
        assert title.startswith("How") and "?" in title, title
        assert re.findall(r"!\[[^]]*\]\(img/([^)]+)\)", section) == [f"fig-{name}.png"], title
        assert (ROOT / "docs" / "img" / f"fig-{name}.png").exists(), name
        assert plot.table(name) in section, f"{title}: the table differs from plot.py's for data/{name}.json"
        assert section.count("\n| ") == len(plot.load(name)["rows"]) + 1, f"{title}: one table only"
        assert "```bash" in section and "Conditions:" in section, title
    assert len(page) < 12000, "the figures page is meant to stay short: history goes to developer.md"


@pytest.mark.slow
def test_pages_render_with_nothing_cut(tmp_path):
    """`make docs-shots` as a test: headless chromium renders the index, figures, reference,
    install and security pages at 1280 px; no code block, table or image is wider than its box or
    the content column, every screenshot is written, and the figures page stays short."""
    import json
    import shutil

    pytest.importorskip("mkdocs", reason="the docs toolchain: bash scripts/setup.sh installs it")
    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no chromium: apt-get install chromium (make docs-shots installs it)")
    out = tmp_path / "shots"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "shots.py"), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert set(report) >= {"index", "figures", "reference", "reference-torch"}, report.keys()
    for page, res in report.items():
        assert res["cut"] == [], (page, res["cut"])
        assert (out / f"{page}.png").stat().st_size > 10_000, page
    assert report["figures"]["height"] < 8000, report["figures"]["height"]


def _public_names():
    import pyddstore.torch

    import pyddstore

    for mod in (pyddstore, pyddstore.torch):
        for name in mod.__all__:
            yield f"{mod.__name__}.{name}", getattr(mod, name)


def test_every_public_name_has_a_docstring_with_an_example():
    pytest.importorskip("torch")
    missing, no_example, members = [], [], []
    for qual, obj in _public_names():
        doc = inspect.getdoc(obj) or ""
        if not doc:
            missing.append(qual)
        elif "Example" not in doc:
            no_example.append(qual)
        if inspect.isclass(obj) and obj.__module__.startswith("pyddstore"):
            for attr, value in vars(obj).items():
                if attr.startswith("_") or not (callable(value) or isinstance(value, property)):
                    continue
                if not (inspect.getdoc(value) or "").strip():
                    members.append(f"{qual}.{attr}")
    assert not missing, f"no docstring: {missing}"
    assert not no_example, f"no example in the docstring: {no_example}"
    assert not members, f"public members without a docstring: {members}"


def _parameters(fn) -> list:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [
        ("**" + n if p.kind is p.VAR_KEYWORD else n)
        for n, p in sig.parameters.items()
        if n not in ("self", "cls") and p.kind is not p.VAR_POSITIONAL
    ]


def test_every_public_callable_documents_each_parameter():
    """An Args section naming every parameter (with its type) in each public function, method
    and constructor of pyddstore and pyddstore.torch (the reference's parameter tables)."""
    pytest.importorskip("torch")
    import re

    undocumented = []
    for qual, obj in _public_names():
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            continue
        targets = [(qual, obj, inspect.getdoc(obj) or "")]
        if inspect.isclass(obj):
            init = vars(obj).get("__init__")
            targets = [(qual, init, inspect.getdoc(obj) or "")] if init is not None else []
            for attr, value in vars(obj).items():
                fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                if not attr.startswith("_") and callable(fn):
                    targets.append((f"{qual}.{attr}", fn, inspect.getdoc(fn) or ""))
        elif not callable(obj):
            continue
        for name, fn, doc in targets:
            params = [p for p in _parameters(fn) if p != "**overrides" or "overrides" not in doc]
            section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
            for p in params:
                if not re.search(rf"^\s+{re.escape(p)}( \([^)]*\))?:", section, re.M):
                    undocumented.append(f"{name}({p})")
    assert not undocumented, f"parameters without an Args entry: {undocumented}"


def test_pyddstore_help_lists_get_and_get_batch():
    import pyddstore

    assert "get_batch" in vars(pyddstore.PyDDStore) and "get" in vars(pyddstore.PyDDStore)
    assert "method: 0 reads with MPI RMA" in pyddstore.PyDDStore.__doc__
    assert "Default: `DDSTORE_METHOD`, else 0 with an MPI communicator, else 1" in pyddstore.PyDDStore.__doc__


def test_tuning_guide_lists_every_environment_variable():
    import re

    sources = [*ROOT.glob("ddstore-*/src/**/*.rs"), *ROOT.glob("pyddstore/src/*.rs")]
    sources += [*ROOT.glob("pyddstore/python/pyddstore/**/*.py")]
    used = set()
    for path in sources:
        used |= set(re.findall(r"DDSTORE_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    guide = (ROOT / "docs" / "guides" / "tuning.md").read_text()
    missing = sorted(v for v in used if v not in guide)
    assert not missing, f"docs/guides/tuning.md does not document {missing}"


def test_nothing_points_outside_the_repository():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        assert "../shared" not in text and "/work/" not in text, path


def _repository_text_files():
    skip = {".git", "target", "site", "bench-results", "node_modules"}
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).parts
        if any(part in skip or part.startswith(".venv") for part in rel) or not path.is_file():
            continue
        if path.suffix in {".py", ".md", ".sh", ".toml", ".txt", ".rs", ".yml", ".yaml", ".cfg", ".pyi"}:
            yield path


def test_no_install_line_names_a_package_index_pyddstore():
    """pyddstore is not on PyPI: a bare install line of that name would install whatever someone else
    registered under that name. Every install line names a checkout (`".[graph]"`) or a package."""
    import re

    name = "pyddstore"
    bare = re.compile(r"pip3? install\s+(?:-\S+\s+)*[\"']?" + name + r"(?![\w/.-])", re.I)
    extras = re.compile(r"(?<![\w./-])[\"']?" + name + r"\[[\w,]+\]")
    offenders = []
    for path in _repository_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if bare.search(line) or extras.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, "install lines naming a package index pyddstore:\n" + "\n".join(offenders)


def test_changelog_and_constraints():
    """CHANGELOG.md's newest entry is this version; scripts/setup.sh installs from the constraints
    file, which pins every package setup installs."""
    import re

    import pyddstore

    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", changelog, re.M).group(1)
    assert newest == pyddstore.__version__, (newest, pyddstore.__version__)
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c scripts/constraints.txt" in setup
    pins = {
        line.split("==")[0].replace("_", "-").lower()
        for line in (ROOT / "scripts" / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    want = re.search(r'^want="([^"]+)"', setup, re.M).group(1).split()
    want += ["torch", "torch_geometric"]
    names = {
        "xdist": "pytest-xdist",
        "material": "mkdocs-material",
        "mkdocstrings_handlers.python": "mkdocstrings-python",
    }
    missing = [w for w in want if names.get(w, w).replace("_", "-").lower() not in pins]
    assert not missing, f"scripts/constraints.txt pins none of {missing}"
