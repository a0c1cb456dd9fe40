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

Numba costs a process ~1 s the first time (its import, ~0.35 s, and its first
call, ~0.45-0.7 s, here; compiling from an empty cache, once per install,
several seconds): about what the Python passes of one ``place()`` of a
10,000-op step cost (ResNet-200's, 10,358 ops on 4 P100s: a first ``place()``
in a fresh process measured 3.9-4.7 s with numba loading, 4.2-4.4 s without).
So numba is imported on first use only, and a process takes the compiled pass
for graphs of at least :data:`MIN_OPS_TO_LOAD` ops, then for every graph once
it is loaded (:func:`use_compiled`); the decisions are the same either way.

Without numba (``pip install numba``), or with ``FDDPS_NO_JIT=1`` in the
environment, :data:`AVAILABLE` is false and the Python loop runs.
"""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np

#: Whether the compiled list pass can be used (numba installed, ``FDDPS_NO_JIT`` unset).
AVAILABLE = not os.environ.get("FDDPS_NO_JIT") and importlib.util.find_spec("numba") is not None

#: A process that has not loaded numba yet loads it for graphs of at least this many ops.
MIN_OPS_TO_LOAD = 15_000

#: The functions compiled, in the order numba resolves them (callees first).
_KERNELS = ("_earliest_start", "_insert", "_heap_push", "_heap_pop", "_candidates",
            "_ready_times", "_sort_by_bound", "_place", "_list_pass", "_heap3_push",
            "_heap3_pop", "_fddps_pass")
_loaded = False


def use_compiled(num_ops: int) -> bool:
    """Whether a list pass over ``num_ops`` ops runs compiled in this process.

    >>> use_compiled(0) in (True, False)
    True
    """
    return AVAILABLE and (_loaded or num_ops >= MIN_OPS_TO_LOAD)


def _load():
    """Import numba and compile (or load from its on-disk cache) the kernels, once."""
    global _loaded
    if _loaded:
        return
    from numba import njit

    module = globals()
    for name in _KERNELS:
        # Cached next to this file, or in the user's cache directory where that is read-only.
        module[name] = njit(cache=True)(module[name])
    _loaded = True


def warm_up() -> float:
    """Load the compiled pass and run it once on a two-op graph; its seconds (what the
    first compiled pass of a process costs over the next ones).

    Raises
    ------
    RuntimeError
        If the compiled pass is not available (:data:`AVAILABLE`).
    """
    if not AVAILABLE:
        raise RuntimeError("the compiled list pass needs numba (and FDDPS_NO_JIT unset)")
    t = time.perf_counter()
    _load()
    ptr, none = np.array([0, 0, 1], np.int64), np.zeros(1, np.int64)
    arrays = dict(pred_ptr=ptr, pred_idx=none, pred_bytes=np.zeros(1), succ_ptr=np.array([0, 1, 1]),
                  succ_idx=np.ones(1, np.int64), durations=np.ones((2, 1)),
                  allowed=np.ones((2, 1), np.bool_), lat=0.0, inv=0.0,
                  group=np.full(2, -1, np.int64), group_need=np.zeros(0), need=np.zeros(2),
                  capacity=np.ones(1), roomy=1.0, slack=1.0)
    list_pass(arrays, np.zeros(2), True, np.zeros(0, np.int64), np.zeros(1), 0.0)
    fddps_list_pass(arrays, np.zeros(2), np.zeros(2), np.arange(2), np.zeros(1), True, True,
                    True, np.zeros(0, np.int64), np.zeros(1), 0.0)
    return time.perf_counter() - t


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


def _candidates(i, allowed, group, group_device, group_need, need, capacity, roomy, slack,
                reserved, mem_used, devices):
    """PlacementState.candidates: the devices op ``i`` may go to now, into ``devices``;
    ``(count, bytes placing it reserves)``, count 0 where no device has room."""
    g = group[i]
    if g >= 0 and group_device[g] >= 0:
        devices[0] = group_device[g]
        return 1, 0.0
    need_i = need[i] if g < 0 else group_need[g]
    roomy_enough = need_i + reserved * slack <= roomy
    count = 0
    for k in range(allowed.shape[1]):
        if allowed[i, k] and (roomy_enough or mem_used[k] + need_i <= capacity[k]):
            devices[count] = k
            count += 1
    return count, need_i


def _ready_times(i, pred_ptr, pred_idx, pred_bytes, lat, inv, device, finish, devices, count,
                 local, remote, seen, ready_of):
    """PlacementState.ready_times over identical links: when op ``i``'s inputs are on each of
    the first ``count`` ``devices``, into ``ready_of`` (base._latest_arrivals' rules)."""
    lo, hi = pred_ptr[i], pred_ptr[i + 1]
    n_seen = 0
    if hi == lo:
        first_dev, first, second = -1, 0.0, 0.0
    elif hi - lo == 1:
        p = pred_idx[lo]
        first_dev, second = device[p], finish[p]
        first = second + lat + pred_bytes[lo] * inv
    else:
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
        for s in range(n_seen):  # in the order devices first appear, as the dict's
            d = seen[s]
            a = remote[d]
            if a > first:
                first_dev, first, second = d, a, first
            elif a > second:
                second = a
    for j in range(count):
        k = devices[j]
        r = second if k == first_dev else first
        for s in range(n_seen):
            if seen[s] == k:
                if local[k] > r:
                    r = local[k]
                break
        ready_of[j] = r


def _sort_by_bound(bound_of, devices, count, visit):
    """Indices ``0..count-1`` into ``visit``, by ``(bound_of[j], devices[j])`` (insertion sort
    of at most a device count)."""
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
    local, remote = np.zeros(m, np.float64), np.zeros(m, np.float64)
    bound_of, ready_of = np.zeros(m, np.float64), np.zeros(m, np.float64)
    seen, devices, visit = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64)
    while size > 0:
        i = _heap_pop(heap_keys, heap_items, size)
        size -= 1
        count, need_i = _candidates(i, allowed, group, group_device, group_need, need,
                                    capacity, roomy, slack, reserved, mem_used, devices)
        if count == 0:
            return i, reserved
        _ready_times(i, pred_ptr, pred_idx, pred_bytes, lat, inv, device, finish, devices,
                     count, local, remote, seen, ready_of)
        # The device where it finishes first (base._earliest_finish_device).
        for j in range(count):
            bound_of[j] = ready_of[j] + durations[i, devices[j]]
        _sort_by_bound(bound_of, devices, count, visit)
        best_k, s_best, f_best = -1, 0.0, 0.0
        for j in range(count):
            v = visit[j]
            if best_k >= 0 and bound_of[v] >= f_best:
                break
            k = devices[v]
            t = _earliest_start(tl_starts[k], tl_finishes[k], tl_count[k], tl_free[k],
                                ready_of[v], durations[i, k], insertion)
            if best_k < 0 or t + durations[i, k] < f_best:
                best_k, s_best, f_best = k, t, t + durations[i, k]
        reserved = _place(i, best_k, s_best, durations[i, best_k], need_i, reserved, device,
                          start, finish, tl_starts, tl_finishes, tl_ops, tl_count, tl_free,
                          mem_used, group, group_device)
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[q]
            waiting[j] -= 1
            if waiting[j] == 0:
                size = _heap_push(heap_keys, heap_items, size, priority[j], j)
    return -1, reserved


def _place(i, k, s, duration, need_i, reserved, device, start, finish, tl_starts, tl_finishes,
           tl_ops, tl_count, tl_free, mem_used, group, group_device):
    """PlacementState.place without link queues or charged transfers; the bytes reserved
    on all devices after it."""
    f = s + duration
    device[i], start[i], finish[i] = k, s, f
    tl_free[k] = _insert(tl_starts[k], tl_finishes[k], tl_ops[k], tl_count[k], i, s, f,
                         tl_free[k])
    tl_count[k] += 1
    mem_used[k] += need_i
    g = group[i]
    if g >= 0 and group_device[g] < 0:
        group_device[g] = k
    return reserved + need_i


def _heap3_push(k1, k2, k3, items, size, a, b, c, item):
    """Push on a min-heap ordered by ``(k1, k2, k3)`` (``k3`` distinct); the new size."""
    j = size
    while j > 0:
        parent = (j - 1) >> 1
        if k1[parent] < a or (k1[parent] == a and (k2[parent] < b
                                                   or (k2[parent] == b and k3[parent] < c))):
            break
        k1[j], k2[j], k3[j], items[j] = k1[parent], k2[parent], k3[parent], items[parent]
        j = parent
    k1[j], k2[j], k3[j], items[j] = a, b, c, item
    return size + 1


def _heap3_pop(k1, k2, k3, items, size):
    """Pop the smallest entry of :func:`_heap3_push`'s heap of ``size``; its item."""
    top = items[0]
    size -= 1
    a, b, c, item = k1[size], k2[size], k3[size], items[size]
    j = 0
    while True:
        h = 2 * j + 1
        if h >= size:
            break
        if h + 1 < size and (k1[h + 1] < k1[h] or (k1[h + 1] == k1[h] and (
                k2[h + 1] < k2[h] or (k2[h + 1] == k2[h] and k3[h + 1] < k3[h])))):
            h += 1
        if a < k1[h] or (a == k1[h] and (b < k2[h] or (b == k2[h] and c < k3[h]))):
            break
        k1[j], k2[j], k3[j], items[j] = k1[h], k2[h], k3[h], items[h]
        j = h
    k1[j], k2[j], k3[j], items[j] = a, b, c, item
    return top


def _fddps_pass(blevel, tail, rank, succ_comm, lookahead, prefer_parent, pred_ptr, pred_idx,
                pred_bytes, succ_ptr, succ_idx, durations, allowed, lat, inv, insertion, group,
                group_device, group_need, need, capacity, roomy, slack, reserved, mem_used,
                device, start, finish, tl_starts, tl_finishes, tl_ops, tl_count, tl_free):
    """The loop of ``FDDPS._list_schedule`` and ``_find_slot`` over arrays; see
    :func:`fddps_list_pass`. ``(failed op or -1, bytes reserved, critical picks)``."""
    n, m = durations.shape
    # Critical child: the child with the largest w + blevel (the first of equals).
    crit = np.full(n, -1, np.int64)
    for i in range(n):
        best = -1.0
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            v = succ_comm[q] + blevel[succ_idx[q]]
            if v > best:
                best = v
                crit[i] = succ_idx[q]
    waiting = np.empty(n, np.int64)
    est = np.zeros(n, np.float64)
    placed = np.zeros(n, np.bool_)
    r1, r2 = np.empty(n, np.float64), np.empty(n, np.float64)
    r3, r_items = np.empty(n, np.int64), np.empty(n, np.int64)
    fr_keys = np.empty(n + succ_idx.shape[0], np.float64)
    fr_items = np.empty(n + succ_idx.shape[0], np.int64)
    size = fsize = 0
    for i in range(n):
        waiting[i] = pred_ptr[i + 1] - pred_ptr[i]
        if waiting[i] == 0:
            size = _heap3_push(r1, r2, r3, r_items, size, -blevel[i], -blevel[i], rank[i], i)
            fsize = _heap_push(fr_keys, fr_items, fsize, -blevel[i], i)
    max_finish = 0.0
    tol = 1e-9 * (blevel.max() if n else 0.0)
    critical_picks = 0
    local, remote = np.zeros(m, np.float64), np.zeros(m, np.float64)
    bound_of, ready_of = np.zeros(m, np.float64), np.zeros(m, np.float64)
    slot_start = np.zeros(m, np.float64)
    slot_done, is_parent = np.zeros(m, np.bool_), np.zeros(m, np.bool_)
    seen, devices, visit = np.zeros(m, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64)
    while size > 0:
        neg_key = r1[0]
        i = _heap3_pop(r1, r2, r3, r_items, size)
        size -= 1
        while fsize > 0 and placed[fr_items[0]]:
            _heap_pop(fr_keys, fr_items, fsize)
            fsize -= 1
        dcpl = max_finish
        if fsize > 0 and -fr_keys[0] > dcpl:
            dcpl = -fr_keys[0]
        if -neg_key >= dcpl - tol:
            critical_picks += 1
        c = crit[i] if lookahead else -1
        latest_finish = dcpl + tol - tail[i]
        # Find_Slot (FDDPS._find_slot).
        count, need_i = _candidates(i, allowed, group, group_device, group_need, need,
                                    capacity, roomy, slack, reserved, mem_used, devices)
        if count == 0:
            return i, reserved, critical_picks
        _ready_times(i, pred_ptr, pred_idx, pred_bytes, lat, inv, device, finish, devices,
                     count, local, remote, seen, ready_of)
        for j in range(count):
            slot_done[j] = False
        chosen_k, chosen_s = -1, 0.0
        if prefer_parent:  # rule 1: an admitted parent's device, earliest finish first
            for q in range(pred_ptr[i], pred_ptr[i + 1]):
                is_parent[device[pred_idx[q]]] = True
            best_f = 0.0
            for j in range(count):
                k = devices[j]
                if is_parent[k]:
                    if not slot_done[j]:
                        slot_start[j] = _earliest_start(tl_starts[k], tl_finishes[k],
                                                        tl_count[k], tl_free[k], ready_of[j],
                                                        durations[i, k], insertion)
                        slot_done[j] = True
                    fin = slot_start[j] + durations[i, k]
                    if fin <= latest_finish and (chosen_k < 0 or fin < best_f):
                        chosen_k, chosen_s, best_f = k, slot_start[j], fin
            for q in range(pred_ptr[i], pred_ptr[i + 1]):
                is_parent[device[pred_idx[q]]] = False
        if chosen_k < 0:
            for j in range(count):
                k = devices[j]
                bound_of[j] = (ready_of[j] + durations[i, k] + durations[c, k] if c >= 0
                               else ready_of[j])
            _sort_by_bound(bound_of, devices, count, visit)
            best_k, best_s, key1, key2 = -1, 0.0, 0.0, 0.0
            fb_k, fb_s, fb_f = -1, 0.0, 0.0
            for h in range(count):
                j = visit[h]
                if best_k >= 0 and bound_of[j] > key1:
                    break
                k = devices[j]
                if not slot_done[j]:
                    slot_start[j] = _earliest_start(tl_starts[k], tl_finishes[k], tl_count[k],
                                                    tl_free[k], ready_of[j], durations[i, k],
                                                    insertion)
                    slot_done[j] = True
                st = slot_start[j]
                fin = st + durations[i, k]
                if fb_k < 0 or fin < fb_f:
                    fb_k, fb_s, fb_f = k, st, fin  # rule 4, when no device is admitted
                if fin > latest_finish:
                    continue  # formula 11: would lengthen the critical path
                if c >= 0:  # rule 2 (critical child), else rule 3 (earliest start)
                    a, b = fin + durations[c, k], fin
                else:
                    a, b = st, fin
                if best_k < 0 or a < key1 or (a == key1 and b < key2):
                    best_k, best_s, key1, key2 = k, st, a, b
            if best_k >= 0:
                chosen_k, chosen_s = best_k, best_s
            else:
                chosen_k, chosen_s = fb_k, fb_s
        reserved = _place(i, chosen_k, chosen_s, durations[i, chosen_k], need_i, reserved,
                          device, start, finish, tl_starts, tl_finishes, tl_ops, tl_count,
                          tl_free, mem_used, group, group_device)
        placed[i] = True
        f = finish[i]
        if f > max_finish:
            max_finish = f
        for q in range(succ_ptr[i], succ_ptr[i + 1]):
            j = succ_idx[q]
            arrival = f + succ_comm[q]
            if arrival > est[j]:
                est[j] = arrival
            fsize = _heap_push(fr_keys, fr_items, fsize, -(arrival + blevel[j]), j)
            waiting[j] -= 1
            if waiting[j] == 0:
                size = _heap3_push(r1, r2, r3, r_items, size, -(est[j] + blevel[j]),
                                   -blevel[j], rank[j], j)
    return -1, reserved, critical_picks


def _run(kernel, own, arrays, insertion, group_device, mem_used, reserved):
    """Run the kernel named ``kernel`` (looked up once :func:`_load` has compiled it) with
    its own leading arguments ``own`` and the arguments both kernels share; the arrays
    it fills and what it returns, as :func:`list_pass` describes."""
    _load()
    a = arrays
    n, m = a["durations"].shape
    device, start, finish = np.full(n, -1, np.int64), np.zeros(n), np.zeros(n)
    timelines = (np.empty((m, n)), np.empty((m, n)), np.empty((m, n), np.int64),
                 np.zeros(m, np.int64))
    got = globals()[kernel](
        *own, a["pred_ptr"], a["pred_idx"], a["pred_bytes"], a["succ_ptr"], a["succ_idx"],
        a["durations"], a["allowed"], a["lat"], a["inv"], bool(insertion), a["group"],
        group_device, a["group_need"], a["need"], a["capacity"], a["roomy"], a["slack"],
        float(reserved), mem_used, device, start, finish, *timelines, np.zeros(m))
    return (got[0], got[1], device, start, finish, timelines, *got[2:])


def list_pass(arrays, priority, insertion, group_device, mem_used, reserved):
    """Run the list pass over ``arrays`` (``PlacementState.compiled_tables`` and the
    graph's CSR arrays, as ``base.run_compiled`` gathers them).

    Parameters
    ----------
    arrays : dict
        The state's fixed tables and the graph's arrays.
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
        there, the arrays as they were) or -1 when all were placed;
        ``timelines`` is ``(starts, finishes, ops, counts)``, one row per
        device, the first ``counts[k]`` entries in use.
    """
    return _run("_list_pass", (np.ascontiguousarray(priority, dtype=np.float64),), arrays,
                insertion, group_device, mem_used, reserved)


def fddps_list_pass(arrays, blevel, tail, rank, succ_comm, lookahead, prefer_parent,
                    insertion, group_device, mem_used, reserved):
    """FD-DPS's list pass (``FDDPS._list_schedule``) over ``arrays``, as :func:`list_pass`.

    ``blevel``, ``tail`` (b-level less the op's own estimate), ``rank`` (topological
    position) per op and ``succ_comm`` per successor entry are the Python pass's.
    Returns :func:`list_pass`'s tuple with the count of critical picks added.
    """
    own = (np.ascontiguousarray(blevel, dtype=np.float64), np.ascontiguousarray(tail, np.float64),
           np.ascontiguousarray(rank, np.int64), np.ascontiguousarray(succ_comm, np.float64),
           bool(lookahead), bool(prefer_parent))
    return _run("_fddps_pass", own, arrays, insertion, group_device, mem_used, reserved)
