"""Where a job stopped, as data: the state behind DistributedSampler.state_dict() and
ThreadDataLoader.state_dict() (torchdata's StatefulDataLoader protocol), and its checks.

An epoch's order is torch's DistributedSampler list for the rank count the epoch started on
(shuffled with seed + epoch, padded or cut to whole rounds): "the order". A sampler iterates a
*stream*, a slice [start, end) of the order dealt round-robin over the current ranks; a fresh
epoch's stream is the whole order over its own rank count, which is exactly torch's sampler.
When every rank has taken `yielded` samples of a stream (ranks of synchronous data-parallel
training are at the same step), the samples seen so far are the order's first
start + yielded * ranks positions: a resume on the same rank count goes on with the same
stream after `yielded`; on another rank count the unseen rest (without the padding copies)
becomes a new stream dealt over the new ranks, each sample once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data.distributed as _tud

from pyddstore._errors import DDStoreUnsupportedError, DDStoreValueError

SAMPLER_FORMAT = "pyddstore.DistributedSampler"
LOADER_FORMAT = "pyddstore.ThreadDataLoader"
VERSION = 1
# torch.Generator.manual_seed() takes [-2**63, 2**64); a sampler seeds each epoch with seed + epoch.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
# Epochs and torch's base seeds (a random int64 >= 0) are below 2**63.
INT64_MAX = 2**63 - 1


def dataset_name(dataset: Any) -> str | None:
    """The name of the DistDataset/DistDatasetReader behind `dataset` (through wrappers such as
    WindowedDataset and Subset), None for other datasets."""
    for _ in range(16):
        if dataset is None:
            return None
        name = getattr(dataset, "name", None)
        if isinstance(name, str) and getattr(dataset, "ddstore", None) is not None:
            return name
        dataset = getattr(dataset, "ds", None) or getattr(dataset, "dataset", None)
    return None


def total_size(n: int, replicas: int, drop_last: bool) -> int:
    """Length of torch's DistributedSampler order for n samples on `replicas` ranks (torch's
    float arithmetic in integers: exact for any rank count a state may claim)."""
    if drop_last and n % replicas != 0:
        return n // replicas * replicas
    return -(-n // replicas) * replicas


def epoch_order(dataset: Any, replicas: int, seed: int, epoch: int, shuffle: bool, drop_last: bool) -> list:
    """torch's DistributedSampler order of one epoch for `replicas` ranks, before it is dealt
    to the ranks: torch's own __iter__ with one replica and that rank count's length."""
    one = _tud.DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    one.total_size = one.num_samples = total_size(len(dataset), replicas, drop_last)
    one.set_epoch(epoch)
    return list(_tud.DistributedSampler.__iter__(one))


def stream_len(start: int, end: int, replicas: int, rank: int) -> int:
    """Samples rank `rank` takes of the stream [start, end) dealt over `replicas` ranks."""
    return len(range(rank, end - start, replicas))


def bad_state(what: str, detail: str) -> DDStoreValueError:
    """A state that cannot be loaded: what it is a state of, and what is wrong with it."""
    return DDStoreValueError(f"{what}: {detail}")


def _int(state: dict, key: str, what: str, lo: int | None = 0, hi: int | None = None) -> int:
    v = state.get(key)
    if (
        isinstance(v, bool)
        or not isinstance(v, int)
        or (lo is not None and v < lo)
        or (hi is not None and v > hi)
    ):
        if hi is not None:
            bound = f"an integer in [{lo}, {hi}]"
        else:
            bound = "an integer" if lo is None else f"an integer >= {lo}"
        raise bad_state(what, f"{key!r} is {v!r}, expected {bound} (a corrupted or foreign state?)")
    return v


def check_seed(seed: int, epoch: int, what: str, seed_of: str = "'seed'") -> None:
    """seed + epoch (the epoch's shuffle seed) and the next epoch's are seeds torch takes
    (the seed in [SEED_MIN, SEED_MAX] and the epoch >= 0 checked before)."""
    if seed + epoch + 1 > SEED_MAX:
        raise bad_state(
            what,
            f"{seed_of} {seed} + 'epoch' {epoch}: the seed of this epoch or the next is past torch's "
            f"largest seed {SEED_MAX} (a corrupted state?)",
        )


def _bool(state: dict, key: str, what: str) -> bool:
    v = state.get(key)
    if not isinstance(v, bool):
        raise bad_state(what, f"{key!r} is {v!r}, expected true or false (a corrupted or foreign state?)")
    return v


def _name(state: dict, key: str, what: str) -> str | None:
    v = state.get(key)
    if v is not None and not isinstance(v, str):
        raise bad_state(what, f"{key!r} is {v!r}, expected a string or null")
    return v


def _header(state: Any, fmt: str, what: str) -> dict:
    if not isinstance(state, dict):
        raise bad_state(what, f"expected the dict state_dict() returned, got {type(state).__name__}")
    if state.get("format") != fmt:
        raise bad_state(
            what, f"'format' is {state.get('format')!r}, expected {fmt!r} (another object's state?)"
        )
    if state.get("version") != VERSION:
        raise bad_state(
            what, f"'version' is {state.get('version')!r}; this pyddstore reads version {VERSION}"
        )
    return state


def check_dataset(state: dict, dataset: Any, what: str, len_key: str, name_key: str) -> None:
    """The state's dataset length and name are this dataset's."""
    n = _int(state, len_key, what)
    name = _name(state, name_key, what)
    if n != len(dataset):
        raise bad_state(what, f"the state is for a dataset of {n} samples, this one has {len(dataset)}")
    mine = dataset_name(dataset)
    if name is not None and mine is not None and name != mine:
        raise bad_state(what, f"the state is for dataset {name!r}, this one is {mine!r}")


class Stream:
    """The part of an epoch's order a sampler iterates: order positions [start, end) of the
    order made for `order_replicas` ranks, dealt round-robin over `replicas` ranks."""

    __slots__ = ("start", "end", "order_replicas", "replicas")

    def __init__(self, start: int, end: int, order_replicas: int, replicas: int):
        self.start, self.end, self.order_replicas, self.replicas = start, end, order_replicas, replicas

    @classmethod
    def fresh(cls, sampler: Any) -> Stream:
        """A whole epoch on the sampler's rank count: torch's own sampler."""
        n = sampler.num_replicas
        return cls(0, total_size(len(sampler.dataset), n, sampler.drop_last), n, n)

    def is_fresh(self, sampler: Any) -> bool:
        f = Stream.fresh(sampler)
        return (self.start, self.end, self.order_replicas, self.replicas) == (
            f.start,
            f.end,
            f.order_replicas,
            f.replicas,
        )

    def length(self, rank: int) -> int:
        return stream_len(self.start, self.end, self.replicas, rank)

    def indices(self, sampler: Any, epoch: int) -> list:
        # The order's first n positions are the shuffle itself, the same for every rank count
        # (torch pads after them or cuts them): only a stream into the padding needs the order
        # of order_replicas ranks, and check_sampler_state() allows that only where
        # order_replicas is the stream's rank count.
        n = len(sampler.dataset)
        replicas = self.order_replicas if self.end > n else 1
        order = epoch_order(
            sampler.dataset, replicas, sampler.seed, epoch, sampler.shuffle, sampler.drop_last
        )
        return order[self.start : self.end][sampler.rank :: self.replicas]


def sampler_state(sampler: Any, epoch: int, stream: Stream, yielded: int) -> dict:
    """A DistributedSampler's state: JSON data (ints, bools, strings)."""
    return {
        "format": SAMPLER_FORMAT,
        "version": VERSION,
        "epoch": int(epoch),
        "seed": int(sampler.seed),
        "shuffle": bool(sampler.shuffle),
        "drop_last": bool(sampler.drop_last),
        "dataset_len": len(sampler.dataset),
        "dataset_name": dataset_name(sampler.dataset),
        "num_replicas": stream.replicas,
        "rank": int(sampler.rank),
        "order_replicas": stream.order_replicas,
        "start": stream.start,
        "end": stream.end,
        "yielded": int(yielded),
    }


def check_sampler_state(state: Any, sampler: Any, exact: bool) -> tuple[int, Stream, int]:
    """(epoch, stream, yielded) to resume `sampler` (its rank count) from `state`; raises
    DDStoreValueError naming what does not fit."""
    what = "DistributedSampler.load_state_dict"
    _header(state, SAMPLER_FORMAT, what)
    epoch = _int(state, "epoch", what, hi=INT64_MAX)
    check_seed(_int(state, "seed", what, lo=SEED_MIN, hi=SEED_MAX), epoch, what)
    for key in ("shuffle", "drop_last"):
        if _bool(state, key, what) != bool(getattr(sampler, key)):
            raise bad_state(
                what, f"the state has {key}={state[key]}, this sampler {key}={getattr(sampler, key)}"
            )
    check_dataset(state, sampler.dataset, what, "dataset_len", "dataset_name")
    n = len(sampler.dataset)
    replicas = _int(state, "num_replicas", what, lo=1)
    rank = _int(state, "rank", what)
    order_replicas = _int(state, "order_replicas", what, lo=1)
    start, end, yielded = (_int(state, k, what) for k in ("start", "end", "yielded"))
    if rank >= replicas:
        raise bad_state(what, f"'rank' {rank} is not below 'num_replicas' {replicas}")
    full = total_size(n, order_replicas, sampler.drop_last)
    if not start <= end <= full:
        raise bad_state(what, f"'start' {start} and 'end' {end} are not within the epoch's {full} positions")
    if n < end and start < end and order_replicas != replicas:
        # torch pads the order of a fresh epoch only; the rest dealt over other ranks stops at n.
        raise bad_state(
            what,
            f"'end' {end} is past the dataset's {n} samples (torch's padding), which only a stream on "
            f"the rank count its order was made for reaches: 'order_replicas' {order_replicas}, "
            f"'num_replicas' {replicas}",
        )
    if yielded > stream_len(start, end, replicas, rank):
        mine = stream_len(start, end, replicas, rank)
        raise bad_state(what, f"'yielded' {yielded} is more than rank {rank}'s {mine} samples")
    if replicas == sampler.num_replicas:
        return epoch, Stream(start, end, order_replicas, replicas), yielded
    if exact:
        raise bad_state(
            what,
            f"the state is from {replicas} ranks and this job has {sampler.num_replicas}: the exact batches "
            "cannot be resumed (exact=False deals the epoch's unseen samples over the new ranks)",
        )
    # Every rank took `yielded` of its part: the order's first start + yielded * replicas
    # positions are seen. The rest, without torch's padding copies, goes to the new ranks.
    seen, end = min(start + yielded * replicas, end), min(end, n)
    return epoch, Stream(min(seen, end), end, order_replicas, sampler.num_replicas), 0


def loader_fields(state: Any, what: str) -> dict:
    """The ThreadDataLoader state's own fields, checked."""
    _header(state, LOADER_FORMAT, what)
    epoch = state.get("epoch")
    if epoch is not None:
        _int(state, "epoch", what, hi=INT64_MAX)
    for key in ("batches_yielded", "samples_yielded"):
        _int(state, key, what)
    if state.get("base_seed") is not None:  # torch draws it as a random int64 >= 0
        _int(state, "base_seed", what, hi=INT64_MAX)
    if state.get("num_replicas") is not None:
        _int(state, "num_replicas", what, lo=1)
    _bool(state, "finished", what)
    _bool(state, "drop_last", what)
    if state.get("batch_size") is not None:
        _int(state, "batch_size", what, lo=1)
    for key in ("generator", "sampler_generator"):
        g = state.get(key)
        if g is not None and (not isinstance(g, list) or not all(type(b) is int and 0 <= b < 256 for b in g)):
            raise bad_state(what, f"{key!r} is not a list of bytes (a corrupted state?)")
    if state.get("sampler") is not None and not isinstance(state["sampler"], dict):
        raise bad_state(what, "'sampler' is not a dict (a corrupted state?)")
    if state.get("mode") not in ("sampler", "skip"):
        raise bad_state(what, f"'mode' is {state.get('mode')!r}, expected 'sampler' or 'skip'")
    return state


def check_position(
    state: dict, what: str, samples: int | None, batch_size: int | None, drop_last: bool, batches: int | None
) -> None:
    """The loader state's batches_yielded and samples_yielded are a position inside one
    iteration over `samples` samples of this rank (None: unknown) in batches of `batch_size`
    (1 without automatic batching), or over `batches` batches of a user's batch_sampler
    (batch_size None; None: unknown)."""
    b, s = state["batches_yielded"], state["samples_yielded"]
    if batch_size is not None and samples is not None:
        batches = samples // batch_size if drop_last else -(-samples // batch_size)
    if batches is not None and b > batches:
        raise bad_state(what, f"'batches_yielded' {b} is past the epoch's {batches} batches of this rank")
    if samples is not None and s > samples:
        raise bad_state(what, f"'samples_yielded' {s} is past the epoch's {samples} samples of this rank")
    if batch_size is not None:
        full = b * batch_size  # every batch whole but an epoch's last (drop_last=False)
        if drop_last:
            fits = s == full
        elif samples is not None:
            fits = s == min(full, samples)
        else:  # a sampler without a length: only the last batch may be short
            fits = full - batch_size < s <= full
        if not fits:
            raise bad_state(
                what, f"'samples_yielded' {s} is not what 'batches_yielded' {b} batches of {batch_size} hold"
            )


def generator_state(g: Any) -> list | None:
    return None if g is None else g.get_state().tolist()


def set_generator_state(g: Any, state: list | None, what: str) -> None:
    if g is None or state is None:
        return
    try:
        g.set_state(torch.tensor(state, dtype=torch.uint8))
    except (RuntimeError, ValueError) as e:
        raise bad_state(what, f"the generator state does not fit this generator ({e})") from None


def unsupported(what: str, why: str) -> DDStoreUnsupportedError:
    return DDStoreUnsupportedError(f"{what}: {why}")
