"""One dispatch for ThreadDataLoader's two worker iterators (threads in _loader.py, processes in
_procloader.py): which worker gets the next batch's indices, how many tasks are in flight, and
the order answers are handed out in, as torch's multiprocessing iterator keeps them (the same
round-robin, the same in_order rules); and the handshake by which persistent workers finish the
last epoch's tasks before the next one starts."""

from __future__ import annotations

import itertools
from typing import Any, Callable

from . import _torch_compat as _tc


class ResumeEpoch:
    """Sent to persistent workers at a new epoch; echoed back once the old tasks are done."""


_NO_ANSWER = object()


class Task:
    """A batch sent to a worker: its worker, its slot (process workers' shared memory; None for
    threads) and, once answered while an earlier batch is awaited, the answer."""

    __slots__ = ("wid", "slot", "answer")

    def __init__(self, wid: int, slot: int | None):
        self.wid = wid
        self.slot = slot
        self.answer: Any = _NO_ANSWER

    @property
    def answered(self) -> bool:
        return self.answer is not _NO_ANSWER


class Dispatch:
    """One epoch's tasks of `num_workers` workers, `prefetch_factor` each in flight: `worker()`
    picks the next one round-robin (with in_order=False, only a worker below its share, as torch
    does), `sent()` records a task, `next_answer()` returns the next task to hand out with its
    answer. `reset()` starts a new epoch."""

    def __init__(self, num_workers: int, prefetch_factor: int, in_order: bool):
        self.num_workers = num_workers
        self.max_tasks = prefetch_factor * num_workers
        self.in_order = in_order
        self.reset()

    def reset(self) -> None:
        """A fresh epoch: nothing sent, received or in flight; every worker active."""
        self.send_idx = 0  # the next task's number
        self.rcvd_idx = 0  # the next task to hand out (in order)
        self.tasks: dict[int, Task] = {}  # sent and not yet handed out
        self.outstanding = 0  # sent and not yet answered
        self.active = [True] * self.num_workers  # False: an iterable dataset's worker ran out
        self.num_tasks = [0] * self.num_workers  # per worker: sent and not yet handed out
        self._cycle = itertools.cycle(range(self.num_workers))

    def full(self) -> bool:
        """Whether num_workers * prefetch_factor tasks are sent and not yet handed out (torch
        sends one task per batch handed out)."""
        return len(self.tasks) >= self.max_tasks

    def worker(self) -> int | None:
        """The worker the next task goes to (None: no active worker may take one now)."""
        share = self.max_tasks // max(1, sum(self.active))
        for _ in range(self.num_workers):
            wid = next(self._cycle)
            if self.active[wid] and (self.in_order or self.num_tasks[wid] < share):
                return wid
        return None

    def sent(self, wid: int, slot: int | None = None) -> int:
        """Records a task sent to worker `wid` (into `slot`); returns its number."""
        idx = self.send_idx
        self.tasks[idx] = Task(wid, slot)
        self.num_tasks[wid] += 1
        self.outstanding += 1
        self.send_idx += 1
        return idx

    def next_answer(self, receive: Callable[[], tuple], dropped: Callable[[Task], None]) -> Task:
        """The next task to hand out, with its answer: the next in order (in_order) or the first
        answered. `receive()` waits for a worker's next `(task number, answer)`; a task of a
        worker that ran out is dropped (`dropped(task)`, e.g. to free its slot). StopIteration:
        every task of the epoch was handed out."""
        while True:
            while self.rcvd_idx < self.send_idx:
                task = self.tasks.get(self.rcvd_idx)
                if task is not None and (task.answered or self.active[task.wid]):
                    break
                if task is not None:
                    self._drop(self.rcvd_idx, dropped)
                self.rcvd_idx += 1
            else:
                raise StopIteration
            task = self.tasks[self.rcvd_idx]
            if task.answered:
                return self._hand_out(self.rcvd_idx)
            idx, answer = receive()
            if isinstance(idx, ResumeEpoch):
                continue
            self.outstanding -= 1
            if isinstance(answer, _tc.IterableStop):
                self.active[answer.worker_id] = False
                self._drop(idx, dropped)
                continue
            self.tasks[idx].answer = answer
            if idx == self.rcvd_idx or not self.in_order:
                return self._hand_out(idx)

    def _hand_out(self, idx: int) -> Task:
        task = self.tasks.pop(idx)
        self.num_tasks[task.wid] -= 1
        if idx == self.rcvd_idx:
            self.rcvd_idx += 1
        return task

    def _drop(self, idx: int, dropped: Callable[[Task], None]) -> None:
        task = self.tasks.pop(idx)
        self.num_tasks[task.wid] -= 1
        dropped(task)


def finish_last_epoch(
    queues: list, receive: Callable[[], tuple], keep: Callable[[int, Any], None] | None = None
) -> None:
    """Persistent workers: every worker (one task queue each) finishes what the last epoch left
    in flight and echoes ResumeEpoch; those answers are dropped, or given to keep(idx, answer)."""
    for q in queues:
        q.put(ResumeEpoch())
    waiting = len(queues)
    while waiting > 0:
        idx, answer = receive()
        if isinstance(idx, ResumeEpoch):
            waiting -= 1
        elif keep is not None:
            keep(idx, answer)
