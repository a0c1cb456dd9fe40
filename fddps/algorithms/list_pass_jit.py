"""The list pass on identical links, compiled: what :func:`~fddps.algorithms.base.list_schedule`
runs where every link has one latency and bandwidth and no transfer is charged to a device
(every preset of identical GPUs).

The list pass is most of ``place()``'s decision on such clusters: the
forward-backward refinement makes two to a dozen of them over thousands of ops,
and in Python each costs ~35 µs an op (Inception-V3's training step, 4 P100s:
~70 ms a pass). Compiled with numba the same decisions cost well under a
microsecond an op plus the arrays' conversion.

It decides exactly as the Python loop (``base._list_schedule_uniform``, kept as
the fallback and as the reference the tests compare it with): the same
floating-point operations in the same order (numba does not reassociate or fuse
them without ``fastmath``), ready ops taken by ``(priority, op)``, devices
visited by ``(ready + duration, device)``, a device's timeline searched as
:meth:`~fddps.algorithms.base.DeviceTimeline.earliest_start` does (a plain scan
from the first interval ending after ``ready``: the blocks there only prune),
and ties in the latest remote arrival of a multi-input op kept by the device
seen first among its inputs, as the Python dict's order keeps them.

Without numba (``pip install numba``), or with ``FDDPS_NO_JIT=1`` in the
environment, :data:`AVAILABLE` is false and the Python loop runs.
"""

from __future__ import annotations

import os

import numpy as np

try:  # numba is a dependency; a Python it does not support yet still gets the Python loop
    if os.environ.get("FDDPS_NO_JIT"):
        raise ImportError("FDDPS_NO_JIT is set")
    from numba import njit
except ImportError:  # pragma: no cover - exercised with FDDPS_NO_JIT=1
    njit = None

#: Whether the compiled list pass is used (numba importable, ``FDDPS_NO_JIT`` unset).
AVAILABLE = njit is not None

#: What :func:`list_pass` returns when an op fits on no device's memory.
OUT_OF_MEMORY = -1


def _earliest_start(starts, finishes, count, free_at, ready, duration, insertion):
    """Earliest start >= ``ready`` on a device whose ``count`` intervals are
    ``starts``/``finishes`` (sorted): DeviceTimeline.earliest_start without its blocks."""
    if ready >= free_at or not insertion or count == 0:
        return ready if ready >= free_at else free_at
    lo, hi = 0, count  # first interval finishing after ready (bisect_right)
    while lo < hi:
        mid = (lo + hi) // 2
        if ready < finishes[mid]:
            hi = mid
        else:
            lo = mid + 1
    t = ready
    for k in range(lo, count):
        if t + duration <= starts[k]:
            return t
        if finishes[k] > t:
            t = finishes[k]
    return t


def _insert(starts, finishes, ops, count, op, start, finish, free_at):
    """Record ``op`` from ``start`` to ``finish`` in a device's sorted arrays (as
    DeviceTimeline.add: after zero-length intervals at the same instant); the
    device's new ``free_at`` (the last interval's finish)."""
    if finish >= free_at and (count == 0 or start >= free_at):
        k = count
        free_at = finish
    else:
        lo, hi = 0, count  # bisect_left on the starts
        while lo < hi:
            mid = (lo + hi) // 2
            if starts[mid] < start:
                lo = mid + 1
            else:
                hi = mid
        k = lo
        while k < count and starts[k] == start and finishes[k] == start:
            k += 1
        for j in range(count, k, -1):
            starts[j] = starts[j - 1]
            finishes[j] = finishes[j - 1]
            ops[j] = ops[j - 1]
    starts[k] = start
    finishes[k] = finish
    ops[k] = op
    return free_at


def _heap_push(keys, items, size, key, item):
    """Push ``(key, item)`` on the binary min-heap of ``size`` entries; the new size."""
    j = size
    while j > 0:
        parent = (j - 1) >> 1
        if keys[parent] < key or (keys[parent] == key and items[parent] < item):
            break
        keys[j], items[j] = keys[parent], items[parent]
        j = parent
    keys[j], items[j] = key, item
    return size + 1


def _heap_pop(keys, items, size):
    """Pop the smallest ``(key, item)`` of the heap of ``size`` entries; the item."""
    top = items[0]
    size -= 1
    key, item = keys[size], items[size]
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and (keys[c + 1] < keys[c]
                             or (keys[c + 1] == keys[c] and items[c + 1] < items[c])):
            c += 1
        if key < keys[c] or (key == keys[c] and item < items[c]):
            break
        keys[j], items[j] = keys[c], items[c]
        j = c
    keys[j], items[j] = key, item
    return top


def _list_pass(priority, pred_ptr, pred_idx, pred_bytes, succ_ptr, succ_idx, durations,
               allowed, lat, inv, insertion, group, group_device, group_need, need,
               capacity, roomy, slack, reserved, mem_used, device, start, finish,
               tl_starts, tl_finishes, tl_ops, tl_count, tl_free):
    """The loop of ``base._list_schedule_uniform`` over arrays; see :func:`list_pass`."""
    n, m = durations.shape
    waiting = np.empty(n, np.int64)
    heap_keys = np.empty(n, np.float64)
    heap_items = np.empty(n, np.int64)
    size = 0
    for i in range(n):
        waiting[i] = pred_ptr[i + 1] - pred_ptr[i]
        if waiting[i] == 0:
            size = _heap_push(heap_keys, heap_items, size, priority[i], i)
    local = np.zeros(m, np.float64)
    remote = np.empty(m, np.float64)
    seen = np.empty(m, np.int64)       # devices in the order their first input appears
    devices = np.empty(m, np.int64)
    bound_of = np.empty(m, np.float64)
    ready_of = np.empty(m, np.float64)
    visit = np.empty(m, np.int64)
    while size > 0:
        i = _heap_pop(heap_keys, heap_items, size)
        size -= 1
        # Devices it may go to (PlacementState.candidates).
        g = group[i]
        if g >= 0 and group_device[g] >= 0:
            count = 1
            devices[0] = group_device[g]
            need_i = 0.0
        else:
            need_i = need[i] if g < 0 else group_need[g]
            roomy_enough = need_i + reserved * slack <= roomy
            count = 0
            for k in range(m):
                if allowed[i, k] and (roomy_enough or mem_used[k] + need_i <= capacity[k]):
                    devices[count] = k
                    count += 1
            if count == 0:
                return i, reserved
        # When its inputs are on each device (PlacementState.ready_times).
        lo, hi = pred_ptr[i], pred_ptr[i + 1]
        multi = hi - lo > 1
        if hi == lo:
            first_dev, first, second = -1, 0.0, 0.0
        elif not multi:
            p = pred_idx[lo]
            first_dev, second = device[p], finish[p]
            first = second + lat + pred_bytes[lo] * inv
        else:  # base._latest_arrivals
            n_seen = 0
            for q in range(lo, hi):
                p = pred_idx[q]
                d, f = device[p], finish[p]
                known = False
                for s in range(n_seen):
                    if seen[s] == d:
                        known = True
                        break
                if not known:
                    seen[n_seen] = d
                    n_seen += 1
                    local[d] = -1.0
                    remote[d] = -1.0
                if f > local[d]:
                    local[d] = f
                a = f + lat + pred_bytes[q] * inv
                if a > remote[d]:
                    remote[d] = a
            first_dev, first, second = -1, 0.0, 0.0
            for s in range(n_seen):
                d = seen[s]
                a = remote[d]
                if a > first:
                    first_dev, first, second = d, a, first
                elif a > second:
                    second = a
        # The device where it finishes first (base._earliest_finish_device).
        for j in range(count):
            k = devices[j]
            r = second if k == first_dev else first
            if multi:
                own = 0.0
                for s in range(n_seen):
                    if seen[s] == k:
                        own = local[k]
                        break
                if own > r:
                    r = own
            ready_of[j] = r
            bound_of[j] = r + durations[i, k]
        # Visit by (bound, device): an insertion sort of at most m entries.
        for j in range(count):
            visit[j] = j
        for j in range(1, count):
            v = visit[j]
            b, k = bound_of[v], devices[v]
            h = j - 1
            while h >= 0 and (bound_of[visit[h]] > b
                              or (bound_of[visit[h]] == b and devices[visit[h]] > k)):
                visit[h + 1] = visit[h]
                h -= 1
            visit[h + 1] = v
        best_k, s_best, f_best = -1, 0.0, 0.0
        for j in range(count):
            v = visit[j]
            if best_k >= 0 and bound_of[v] >= f_best:
                break
            k = devices[v]
            r = ready_of[v]
            t = _earliest_start(tl_starts[k], tl_finishes[k], tl_count[k], tl_free[k], r,
                                durations[i, k], insertion)
            if best_k < 0 or t + durations[i, k] < f_best:
                best_k, s_best, f_best = k, t, t + durations[i, k]
        # Place it (PlacementState.place without link queues or charged transfers).
        k = best_k
        f = s_best + durations[i, k]
        device[i], start[i], finish[i] = k, s_best, f
        tl_free[k] = _insert(tl_starts[k], tl_finishes[k], tl_ops[k], tl_count[k], i, s_best, f,
                             tl_free[k])
        tl_count[k] += 1
        mem_used[k] += need_i
        reserved += need_i
        if g >= 0 and group_device[g] < 0:
            group_device[g] = k
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[q]
            waiting[j] -= 1
            if waiting[j] == 0:
                size = _heap_push(heap_keys, heap_items, size, priority[j], j)
    return -1, reserved


if AVAILABLE:
    # Compiled on first use and cached on disk (numba's cache: next to this file, or the
    # user's cache directory where that is read-only): ~2 s once, then ~0.1 s a process.
    _earliest_start = njit(cache=True)(_earliest_start)
    _insert = njit(cache=True)(_insert)
    _heap_push = njit(cache=True)(_heap_push)
    _heap_pop = njit(cache=True)(_heap_pop)
    _list_pass = njit(cache=True)(_list_pass)


def list_pass(arrays, priority, insertion, group_device, mem_used, reserved):
    """Run the list pass over ``arrays`` (:meth:`PlacementState.jit_arrays`).

    Parameters
    ----------
    arrays : dict
        The state's fixed tables as numpy arrays.
    priority : array of float64, shape (n,)
        Smaller goes first among ready ops (ties: op index).
    insertion : bool
    group_device : array of int64
        The device of each colocation group (-1: none yet); filled in.
    mem_used : array of float64, shape (m,)
        Bytes reserved per device; added to.
    reserved : float
        Bytes reserved on all devices together.

    Returns
    -------
    (failed, reserved, device, start, finish, timelines)
        ``failed`` is the op that fitted on no device's memory (the pass stopped
        there, the arrays as they were) or :data:`OUT_OF_MEMORY`'s -1 when all
        were placed; ``timelines`` is ``(starts, finishes, ops, counts)``, one
        row per device, the first ``counts[k]`` entries in use.
    """
    a = arrays
    n, m = a["durations"].shape
    device = np.full(n, -1, np.int64)
    start = np.zeros(n, np.float64)
    finish = np.zeros(n, np.float64)
    tl_starts = np.empty((m, n), np.float64)
    tl_finishes = np.empty((m, n), np.float64)
    tl_ops = np.empty((m, n), np.int64)
    tl_count = np.zeros(m, np.int64)
    tl_free = np.zeros(m, np.float64)
    failed, reserved = _list_pass(
        np.ascontiguousarray(priority, dtype=np.float64), a["pred_ptr"], a["pred_idx"],
        a["pred_bytes"], a["succ_ptr"], a["succ_idx"], a["durations"], a["allowed"],
        a["lat"], a["inv"], bool(insertion), a["group"], group_device, a["group_need"],
        a["need"], a["capacity"], a["roomy"], a["slack"], float(reserved), mem_used,
        device, start, finish, tl_starts, tl_finishes, tl_ops, tl_count, tl_free)
    return failed, reserved, device, start, finish, (tl_starts, tl_finishes, tl_ops, tl_count)
