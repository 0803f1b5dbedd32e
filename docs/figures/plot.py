"""Draws the figures of docs/figures.md from the numbers in docs/figures/data/*.json, and prints
each section's table as the page shows it.

    python docs/figures/plot.py            # docs/img/fig-*.png and the tables
    python docs/figures/plot.py --tables   # the tables only (tests/test_docs.py compares them)
    python docs/figures/plot.py --scale bench-results/bench-scale.json   # take a scale bench's run

Each data file names its question, where its numbers come from (a benchmark's --json run, or a
documented run's table), the command that measures them again and the conditions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
IMG = HERE.parent / "img"
SECTIONS = ("read", "load", "graph", "loaders", "spill", "scale", "steps")
WIDTH = 7.2  # inches at 110 dpi: about 790 px, the page's column


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def _fmt(value) -> str:
    if value is None:
        return "not run"
    if isinstance(value, list):
        return "-".join(_fmt(v) for v in value)
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(name: str) -> str:
    """The section's table in Markdown, its numbers as the data file has them."""
    d = load(name)
    lines = ["| " + " | ".join(d["columns"]) + " |", "|" + "---|" * len(d["columns"])]
    for row in d["rows"]:
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


def _bars(ax, labels, values, color="tab:blue", xerr=None):
    y = range(len(labels))
    ax.barh(list(y), values, color=color, xerr=xerr, capsize=3)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)


def _paired_axes(ax, labels):
    """Row labels top to bottom on a log x axis, for two bars per row."""
    ax.set_yticks(list(range(len(labels))))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.grid(True, axis="x", which="both", alpha=0.3)


def plot_read(plt):
    d = load("read")
    rows = d["rows"]
    labels = [r[0] for r in rows]
    colors = ["tab:gray" if "ceiling" in r[0] else "tab:blue" for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH, 3.4), sharey=True)
    _bars(a, labels, [r[2] for r in rows], colors)
    a.set_xlabel("µs per row, 3 KB rows\n(lower is better)")
    _bars(b, labels, [r[3] for r in rows], colors)
    b.set_xlabel("GB/s, 1 MB rows\n(higher is better)")
    fig.suptitle("Reading random rows of another rank, batches of 128", fontsize=10)
    return fig


def plot_load(plt):
    d = load("load")
    rows = d["rows"]
    labels = [r[0].replace("DistDataset, ", "") for r in rows]
    lo = [min(r[1], r[2]) for r in rows]
    hi = [max(r[1], r[2]) for r in rows]
    mid = [(x + y) / 2 for x, y in zip(lo, hi)]
    err = [[m - x for m, x in zip(mid, lo)], [y - m for m, y in zip(mid, hi)]]
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2))
    colors = ["tab:green" if "preads" in r[3] else "tab:blue" for r in rows]
    _bars(ax, labels, mid, colors, xerr=err)
    ax.axvline(1.0, color="k", ls="--", lw=1)
    ax.text(1.01, len(rows) - 0.6, "64-thread read\nof the files", fontsize=7, va="bottom")
    ax.set_xlabel("x the read limit (two runs: bar = mean, whiskers = the two)")
    ax.set_title("Loading 242 MiB per rank from 1,500 files, cold page cache", fontsize=10)
    return fig


def plot_graph(plt):
    d = load("graph")
    rows = d["rows"]
    fig, ax = plt.subplots(figsize=(WIDTH, 2.6))
    y = list(range(len(rows)))
    for k, (name, color) in enumerate((("ragged", "tab:blue"), ("padded to fixed rows", "tab:orange"))):
        lo = [r[1 + k][0] for r in rows]
        hi = [r[1 + k][1] for r in rows]
        mid = [(a + b) / 2 for a, b in zip(lo, hi)]
        err = [[m - a for m, a in zip(mid, lo)], [b - m for m, b in zip(mid, hi)]]
        at = [v + 0.2 * (2 * k - 1) for v in y]
        ax.barh(at, mid, height=0.4, color=color, xerr=err, capsize=3, label=name)
    _paired_axes(ax, [r[0] for r in rows])
    ax.set_xlabel("µs per graph, batches of 128 (lower is better; whiskers: ten runs)")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def plot_loaders(plt):
    d = load("loaders")
    rows = d["rows"]
    fig, ax = plt.subplots(figsize=(WIDTH, 3.0))
    colors = ["tab:blue"] + ["tab:gray"] * (len(rows) - 1)
    _bars(ax, [r[0] for r in rows], [r[1] for r in rows], colors)
    ax.set_xscale("log")
    ax.set_xlim(300, 3e7)
    for i, r in enumerate(rows):
        ax.text(r[1] * 1.15, i, f"{r[1]:,}: {r[2]}", va="center", fontsize=7)
    ax.set_xlabel("samples/s, log scale (higher is better)")
    ax.set_title("An in-memory store against file formats at their defaults", fontsize=10)
    return fig


def plot_spill(plt):
    d = load("spill")
    rows = d["rows"]
    fig, ax = plt.subplots(figsize=(WIDTH, 3.0))
    y = list(range(len(rows)))
    for k, (size, color) in enumerate((("49 KB", "tab:blue"), ("3 KB", "tab:orange"))):
        ys = [v + 0.2 * (2 * k - 1) for v, r in zip(y, rows) if r[1 + k] is not None]
        xs = [r[1 + k] for r in rows if r[1 + k] is not None]
        ax.barh(ys, xs, height=0.4, color=color, label=f"{size} samples")
    _paired_axes(ax, [r[0] for r in rows])
    ax.set_xlabel("the job's samples/s over one epoch, log scale (higher is better)")
    ax.set_title("3 GB through 2 x 384 MiB of memory, cold page cache", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def import_scale(path: str) -> None:
    """data/scale.json from a `python -m pyddstore.benchmarks.scale --json` run: its fits, its
    table and each job's figures (largest over the ranks), without the per-rank reports."""
    d = json.loads(Path(path).read_text())
    for r in d["configs"].values():
        for p in r["points"]:
            p.pop("ranks", None)
    d.pop("vcluster", None)
    d["source"] = "a python -m pyddstore.benchmarks.scale --json run, its per-rank reports left out"
    (DATA / "scale.json").write_text(json.dumps(d, indent=1) + "\n")


def plot_scale(plt):
    d = load("scale")
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.2))
    quantities = (("fds", "descriptors per rank"), ("add_msgs", "per add: MPI calls or file operations"))
    for ax, (q, label) in zip(axes, quantities):
        for k, (config, r) in enumerate(d["configs"].items()):
            ok = [p for p in r["points"] if not p.get("failed") and (p["summary"][q] or 0) > 0]
            if not ok:
                continue
            color = f"C{k}"
            ax.plot(
                [p["n"] for p in ok], [p["summary"][q] for p in ok], "o-", color=color, ms=3, label=config
            )
            f = r["fits"].get(q)
            if f:
                ax.plot(
                    [ok[-1]["n"], 1024, 16384],
                    [ok[-1]["summary"][q], f["1024"], f["16384"]],
                    ":",
                    color=color,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks N (dotted: the fit, to 16,384)")
        ax.set_title(label, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    for limit in d["fd_limits"]:
        axes[0].axhline(limit, color="k", ls="--", lw=0.8)
        axes[0].text(2, limit * 1.1, f"ulimit -n {limit:,}", fontsize=7)
    axes[0].legend(fontsize=7, loc="center right")
    return fig


def import_steps(path: str, conditions: str) -> None:
    """data/steps.json from a `python -m pyddstore.benchmarks.steps --json` run: per workload the
    store's and each DataLoader's accelerator utilization (steady epochs, else the first), the
    lower of the two ranks'."""
    d = json.loads(Path(path).read_text())
    ranks = d["per_rank"]
    names = list(ranks[0]["workloads"])
    workers = sorted(int(k[6:]) for k in ranks[0]["workloads"][names[0]] if k.startswith("torch_"))

    def au(name, key):
        runs = [r["workloads"][name][key] for r in ranks]
        return min((x["steady"] or x["first_epoch"])["au"] for x in runs)

    def worst(name, key, field):
        return (
            max(
                (r["workloads"][name]["store"]["steady"] or r["workloads"][name]["store"]["first_epoch"])[
                    field
                ]
                for r in ranks
            )
            if key == "store"
            else None
        )

    rows = []
    for name in names:
        w = ranks[0]["workloads"][name]
        label = f"{w['sample_bytes'] / 1e6:.3g} MB x {w['batch']}, {name.split('-')[1]}"
        rows.append(
            [label, round(au(name, "store"), 2), round(worst(name, "store", "wait_ms_per_step"), 1)]
            + [round(au(name, f"torch_{k}"), 2) for k in workers]
            + [round(max(r["workloads"][name]["store"]["load_s"] for r in ranks), 1)]
        )
    copy = [
        r["workloads"][n]["read_vs_memcpy"]["ratio"]
        for r in ranks
        for n in names
        if "read_vs_memcpy" in r["workloads"][n]
    ]
    out = {
        "question": "What does a training step wait?",
        "bench": "python -m pyddstore.benchmarks.steps",
        "conditions": conditions,
        "read_vs_memcpy": round(max(copy), 2) if copy else None,
        "columns": ["workload", "store AU", "store wait ms/step"]
        + [f"DataLoader({k}) AU" for k in workers]
        + ["store load s"],
        "rows": rows,
        "source": "a python -m pyddstore.benchmarks.steps --json run (the lower AU of the two ranks)",
    }
    (DATA / "steps.json").write_text(json.dumps(out, indent=1) + "\n")


def plot_steps(plt):
    d = load("steps")
    fig, ax = plt.subplots(figsize=(WIDTH, 2.6))
    cols = d["columns"][1:-1]
    keep = [k for k, c in enumerate(cols) if c.endswith("AU")]
    labels = [r[0] for r in d["rows"]]
    width = 0.8 / len(keep)
    for j, k in enumerate(keep):
        ys = [i + (j - (len(keep) - 1) / 2) * width for i in range(len(labels))]
        ax.barh(ys, [r[1 + k] for r in d["rows"]], height=width, color=f"C{j}", label=cols[k][:-3])
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0.9, color="k", ls="--", lw=0.8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("accelerator utilization: compute time / wall time (higher is better; dashed: 0.9)")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", action="store_true", help="print the tables only")
    ap.add_argument("--scale", metavar="JSON", help="first make data/scale.json from this scale bench run")
    ap.add_argument("--steps", metavar="JSON", help="first make data/steps.json from this steps bench run")
    ap.add_argument("--conditions", default="", help="with --steps: the run's conditions, in a line")
    args = ap.parse_args(argv)
    if args.scale:
        import_scale(args.scale)
    if args.steps:
        import_steps(args.steps, args.conditions)
    for name in SECTIONS:
        print(f"<!-- {name} -->\n{table(name)}\n")
    if args.tables:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in SECTIONS:
        fig = globals()[f"plot_{name}"](plt)
        fig.tight_layout()
        fig.savefig(IMG / f"fig-{name}.png", dpi=110)
        plt.close(fig)
        print(f"wrote {IMG / f'fig-{name}.png'}")


if __name__ == "__main__":
    main()
