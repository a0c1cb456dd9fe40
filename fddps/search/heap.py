"""Freed multi-megabyte arrays kept for reuse in the process's heap (glibc's malloc).

Building the vertex-elimination DP's tables allocates and frees multi-megabyte
numpy temporaries thousands of times (AlexNet at 8 GPUs: a feed's cells are up
to ~10**5-10**6 entries). Under glibc's defaults, a fresh process maps an
allocation of more than 128 KB on its own and unmaps it when freed; the first
such free raises that threshold to its size, and the heap is trimmed back to
the system whenever more than twice that size is free at its top. Either way
each new temporary is memory the kernel zero-fills page by page: AlexNet's
table build (8 P100s) took 40,000-60,000 minor page faults and 0.09-0.16 s of
system time a build, ~10-15% of it.

Freeing one block just below glibc's largest dynamic threshold (32 MB on 64-bit
systems) once per process sets the threshold to 32 MB and the trim threshold to
64 MB, as freeing any such array would: later temporaries up to 32 MB come
from the heap and are reused, and at most 64 MB of freed memory stays with the
process. The block is never written, so it costs a map and an unmap. Elsewhere
(another allocator, a 32-bit system) it changes nothing.
"""

from __future__ import annotations

import numpy as np

#: glibc's largest dynamic mmap threshold on 64-bit systems (``DEFAULT_MMAP_THRESHOLD_MAX``).
MMAP_THRESHOLD_MAX = 32 << 20

_done = False


def reuse_freed_arrays() -> bool:
    """Let malloc keep freed arrays of up to 32 MB for reuse (module notes); once per
    process.

    Returns
    -------
    bool
        True the first time (the block was freed), False after.

    Examples
    --------
    >>> reuse_freed_arrays() in (True, False)
    True
    >>> reuse_freed_arrays()
    False
    """
    global _done
    if _done:
        return False
    _done = True
    # (less than the maximum by two pages: numpy's header and malloc's, rounded up to
    # pages, keep the mapped chunk within it, where glibc adopts its size)
    block = np.empty(MMAP_THRESHOLD_MAX - 8192, dtype=np.uint8)
    del block
    return True


__all__ = ["MMAP_THRESHOLD_MAX", "reuse_freed_arrays"]
