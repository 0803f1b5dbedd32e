"""litdata and mosaicml-streaming over the spill bench's data (see pyddstore.benchmarks.spill).

A developer's harness, not part of the wheel: run by the spill bench with ``--alt-python PATH``
(from a checkout) as a file (not a module: it imports neither
pyddstore nor mpi4py, so it runs in another environment, e.g. ``.venv-alt`` of
``scripts/setup-alt.sh``), one process per rank at once:

    PATH tools/spill_alt.py --src SRC.npy --work DIR --rank R --world W --port P [--which litdata,streaming]

Rank 0 converts the source once per library (their conversion step, timed); then the ranks
join a gloo process group (each library splits an epoch over it), drop the page cache (root),
and read one shuffled epoch of batches, checking the first sample of every 50th batch against
the source. Prints one JSON line: per library, samples/s of this rank and the conversion time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

CHECK_EVERY = 50


def _args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--src", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--which", default="litdata,streaming")
    return p.parse_args(argv)


class _Row:
    """litdata.optimize's fn: sample i of the source, with its index (to check it)."""

    def __init__(self, src: str):
        self.src = src

    def __call__(self, i):
        return {"i": i, "x": np.array(np.load(self.src, mmap_mode="r")[i])}


def _collate(samples):
    return [(int(s["i"]), np.asarray(s["x"])) for s in samples]


def _convert(name: str, src: str, out: str) -> float:
    """Writes the library's copy of `src` into `out` (once); seconds taken."""
    done = out + ".done"
    if os.path.exists(done):
        return 0.0
    try:
        took = _write(name, src, out)
    except BaseException:
        open(out + ".failed", "w").close()  # the other ranks stop waiting
        raise
    open(done, "w").close()
    return took


def _write(name: str, src: str, out: str) -> float:
    t0 = time.perf_counter()
    n = np.load(src, mmap_mode="r").shape[0]
    if name == "litdata":
        import litdata

        litdata.optimize(
            fn=_Row(src), inputs=list(range(n)), output_dir=out, chunk_bytes="64MB", num_workers=2
        )
    else:
        from streaming import MDSWriter

        rows = np.load(src, mmap_mode="r")
        with MDSWriter(out=out, columns={"i": "int64", "x": "bytes"}, size_limit=1 << 26) as w:
            for i in range(n):
                w.write({"i": np.int64(i), "x": rows[i].tobytes()})
    return time.perf_counter() - t0


def _loader(name: str, out: str, a):
    if name == "litdata":
        import litdata

        ds = litdata.StreamingDataset(out, shuffle=True)
        return litdata.StreamingDataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=_collate)
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=out, shuffle=True, batch_size=a.batch)

    def collate(samples):
        return [(int(s["i"]), np.frombuffer(s["x"], np.uint8)) for s in samples]

    return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)


def _drop_caches(rank: int) -> None:
    import torch.distributed as dist

    dist.barrier()
    if rank == 0 and os.geteuid() == 0:
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            pass
    dist.barrier()


def main(argv=None) -> None:
    a = _args(argv)
    want = np.load(a.src, mmap_mode="r")
    if a.rank == 0:
        os.makedirs(a.work, exist_ok=True)
        try:  # a killed earlier run's shared memory would refuse the same directory
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        except Exception:  # noqa: BLE001 - not installed: reported below
            pass
    names = [w for w in a.which.split(",") if w]
    outs = {w: os.path.join(a.work, {"litdata": "litdata", "streaming": "mds"}[w]) for w in names}
    result: dict = {}
    # Conversion before the process group: litdata.optimize would split itself over it.
    if a.rank == 0:
        for w in names:
            try:
                result[w] = {"convert_s": _convert(w, a.src, outs[w])}
            except Exception as e:  # noqa: BLE001 - a library that fails is reported, the rest go on
                result[w] = {"error": f"conversion: {e!r}"}
    else:
        for w in names:
            while not any(os.path.exists(outs[w] + e) for e in (".done", ".failed")):
                time.sleep(0.5)
            result[w] = {} if os.path.exists(outs[w] + ".done") else {"error": "conversion failed on rank 0"}
    # torch.distributed's rendezvous, which litdata and streaming also read to split the epoch.
    rendezvous = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(a.port),
        "RANK": str(a.rank),
        "WORLD_SIZE": str(a.world),
        "LOCAL_RANK": str(a.rank),
        "LOCAL_WORLD_SIZE": str(a.world),
    }
    for key, value in rendezvous.items():
        os.environ[key] = value
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)
    for w in names:
        if "error" in result[w]:
            continue
        try:
            loader = _loader(w, outs[w], a)
            _drop_caches(a.rank)
            n, t0 = 0, time.perf_counter()
            for k, batch in enumerate(loader):
                if k % CHECK_EVERY == 0:
                    i, x = batch[0]
                    if not np.array_equal(x, want[i]):
                        raise AssertionError(f"{w}: sample {i} differs from the source")
                n += len(batch)
            result[w]["samples_per_s"] = n / (time.perf_counter() - t0)
            result[w]["samples"] = n
        except Exception as e:  # noqa: BLE001 - as above
            result[w]["error"] = repr(e)
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.write("ALT " + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
