"""pyddstore's benchmarks: every figure a ratio against a baseline measured in the same run, and
every line's data checked against what the owners stored before it is timed. Not used by the
library; plots need the ``bench`` extra (``pip install ".[bench]"``: matplotlib).

- ``python -m pyddstore bench`` (stores.py): µs per row and GB/s of reads through every store
  configuration; ``--vcluster`` across virtual nodes (cluster.py).
- ``python -m pyddstore.benchmarks.dataset``: DistDataset load memory, load paths (load.py) and
  loader throughput.
- ``python -m pyddstore.benchmarks.workers``: loader workers (threads, processes, torch's).
- ``python -m pyddstore.benchmarks.paths``: the gather path against one-sided reads, alternated
  round by round (``--busy N`` beside busy processes).
- ``python -m pyddstore.benchmarks.graph``: ragged graph reads against padded rows and records.
- ``python -m pyddstore.benchmarks.loaders``: against other streaming loaders.
- ``python -m pyddstore.benchmarks.spill``: a spilled DistDataset epoch against raw reads of its
  spill files, memmap, files and memory (``--alt-python``: litdata and mosaicml-streaming, from a
  checkout).
- ``python -m pyddstore.benchmarks.scale``: what each rank spends (descriptors, memory, messages)
  in jobs of 2 to 64 ranks, every method, fitted against N and extrapolated to 16,384.
- ``python -m pyddstore.benchmarks.steps``: training steps (a batch, then the compute time):
  the accelerator's utilization with the store against torch's DataLoader.

Developers' harnesses live in the repository's ``tools/``, not in the wheel: ``auth_cost.py``
(one build's gather path against another build's) and ``spill_alt.py`` (what ``--alt-python``
runs in another environment).

The settings of each configuration are passed to its stores (``pyddstore.Settings``); no
benchmark writes ``os.environ``.
"""
