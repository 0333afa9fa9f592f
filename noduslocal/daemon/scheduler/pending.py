"""The queue's pending requests, indexed for a pass: by job id, and in buckets by
(priority, interruptible, owner) each kept sorted by job id, so a pass reads the queue
order without sorting every job; with the least CPU and memory any of them asks.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import chain
from operator import attrgetter, itemgetter

from noduslocal.daemon.scheduler.capacity import Request

JOB_ID = attrgetter("job_id")
_ORDER_KEY = itemgetter(0)
_FEW = 8  # started jobs of one bucket taken out one by one; more: the bucket is rebuilt

BucketKey = tuple[int, bool, int]  # (priority, interruptible, owner uid)
# A run of the queue order with one order key, sorted by job id, and the buckets (owner,
# requests) it is made of: one bucket unless owners' fair-share usage ties.
Group = tuple[list[Request], list[tuple[int, list[Request]]]]


def _drop(counts: Counter[int], key: int) -> None:
    if (left := counts[key] - 1) > 0:
        counts[key] = left
    else:
        del counts[key]


class Pending:
    def __init__(self) -> None:
        self.by_id: dict[int, Request] = {}
        self._buckets: dict[BucketKey, list[Request]] = {}
        # Per owner, the GPU counts their requests with a GPU ask: the most any of them
        # asks bounds who may meet the per-user GPU limit.
        self.gpu_counts: dict[int, Counter[int]] = {}
        # CPU and memory asked, over all requests and over those that need no GPU.
        self._cpu: Counter[int] = Counter()
        self._memory: Counter[int] = Counter()
        self._cpu_alone: Counter[int] = Counter()
        self._memory_alone: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, req: Request) -> None:
        """Queue a request, unless its job is queued already."""
        if req.job_id not in self.by_id:
            self.by_id[req.job_id] = req
            self._index(req)

    def remove(self, job_id: int) -> Request | None:
        req = self.by_id.pop(job_id, None)
        if req is not None:
            self._unindex(req)
            self._bucket_remove(req)
        return req

    def replace(self, req: Request) -> bool:
        old = self.by_id.get(req.job_id)
        if old is None:
            return False
        self._unindex(old)
        self._bucket_remove(old)
        self.by_id[req.job_id] = req
        self._index(req)
        return True

    def remove_started(self, started: Iterable[Request]) -> None:
        by_bucket: dict[BucketKey, list[Request]] = {}
        for req in started:
            del self.by_id[req.job_id]
            self._unindex(req)
            by_bucket.setdefault(_key(req), []).append(req)
        for key, gone in by_bucket.items():
            if len(gone) <= _FEW:
                for req in gone:
                    self._bucket_remove(req)
                continue
            ids = {r.job_id for r in gone}
            kept = [r for r in self._buckets[key] if r.job_id not in ids]
            if kept:
                self._buckets[key] = kept
            else:
                del self._buckets[key]

    def groups(self, usage: Callable[[int], float]) -> list[Group]:
        """The queue order: priority (higher first), interruptible last within it, the
        owner's fair-share usage (least first), then job id, as runs of one key."""
        used: dict[int, float] = {}
        keyed = []
        for (priority, interruptible, uid), reqs in self._buckets.items():
            if uid not in used:
                used[uid] = usage(uid)
            keyed.append(((-priority, interruptible, used[uid]), uid, reqs))
        keyed.sort(key=_ORDER_KEY)
        groups: list[Group] = []
        i, n = 0, len(keyed)
        while i < n:
            key = keyed[i][0]
            j = i + 1
            while j < n and keyed[j][0] == key:
                j += 1
            if j == i + 1:
                groups.append((keyed[i][2], [(keyed[i][1], keyed[i][2])]))
            else:  # owners whose usage ties: their jobs interleave by job id
                tied = keyed[i:j]
                merged = sorted(chain.from_iterable(t[2] for t in tied), key=JOB_ID)
                groups.append((merged, [(t[1], t[2]) for t in tied]))
            i = j
        return groups

    def least(self) -> tuple[int, int, int | None, int | None]:
        """The least CPU and memory a pending request asks, and the least a request that
        needs no GPU asks (None: there is none). Only when something is pending."""
        return (min(self._cpu), min(self._memory), min(self._cpu_alone, default=None),
                min(self._memory_alone, default=None))

    def _index(self, req: Request) -> None:
        bucket = self._buckets.setdefault(_key(req), [])
        if not bucket or bucket[-1].job_id < req.job_id:
            bucket.append(req)
        else:  # an older job queued again (a lost attempt, a preempted one)
            insort(bucket, req, key=JOB_ID)
        self._cpu[req.cpu_m] += 1
        self._memory[req.memory] += 1
        if not _needs_gpu(req):
            self._cpu_alone[req.cpu_m] += 1
            self._memory_alone[req.memory] += 1
        if req.gpu is not None:
            self.gpu_counts.setdefault(req.owner_uid, Counter())[req.gpu.count] += 1

    def _unindex(self, req: Request) -> None:
        """Forget a request's counts (its bucket entry is taken out by the caller)."""
        _drop(self._cpu, req.cpu_m)
        _drop(self._memory, req.memory)
        if not _needs_gpu(req):
            _drop(self._cpu_alone, req.cpu_m)
            _drop(self._memory_alone, req.memory)
        if req.gpu is not None:
            counts = self.gpu_counts[req.owner_uid]
            _drop(counts, req.gpu.count)
            if not counts:
                del self.gpu_counts[req.owner_uid]

    def _bucket_remove(self, req: Request) -> None:
        key = _key(req)
        bucket = self._buckets[key]
        i = bisect_left(bucket, req.job_id, key=JOB_ID)
        assert bucket[i].job_id == req.job_id, "a pending request missing from its bucket"
        del bucket[i]
        if not bucket:
            del self._buckets[key]


def _key(req: Request) -> BucketKey:
    return (req.priority, req.interruptible, req.owner_uid)


def _needs_gpu(req: Request) -> bool:
    # A request for 0 GPUs fits without one (pick asks for none): counted as CPU-only.
    return req.gpu is not None and req.gpu.count > 0
