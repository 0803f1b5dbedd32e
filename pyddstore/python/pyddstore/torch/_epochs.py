"""What ThreadDataLoader's thread and process iterators share from epoch to epoch: the
round-robin task bookkeeping torch's multiprocessing iterator keeps (reset at every epoch), and
the handshake by which persistent workers finish the last epoch's tasks before the next."""

from __future__ import annotations

import itertools
from typing import Any, Callable


class ResumeEpoch:
    """Sent to persistent workers at a new epoch; echoed back once the old tasks are done."""


def reset_dispatch(it: Any) -> None:
    """A fresh epoch's task bookkeeping of iterator `it`: nothing sent, received or in flight."""
    it._send_idx = 0
    it._rcvd_idx = 0
    it._task_info = {}  # idx -> (worker, ...) of every task sent and not yet handed out
    it._tasks_outstanding = 0
    it._workers_status = [True] * it._num_workers
    it._workers_num_tasks = [0] * it._num_workers
    it._worker_queue_idx_cycle = itertools.cycle(range(it._num_workers))


def finish_last_epoch(it: Any, keep: Callable[[int, Any], None] | None = None) -> None:
    """Persistent workers: every worker finishes what the last epoch left in flight and echoes
    ResumeEpoch; those results are dropped, or given to keep(idx, data)."""
    for q in it._index_queues:
        q.put(ResumeEpoch())
    waiting = it._num_workers
    while waiting > 0:
        idx, data = it._get_data()
        if isinstance(idx, ResumeEpoch):
            waiting -= 1
        elif keep is not None:
            keep(idx, data)
