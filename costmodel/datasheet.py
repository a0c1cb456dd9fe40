"""A GPU preset from a datasheet: :func:`gpu_from_datasheet`.

For a GPU nobody has timed, the preset takes its peaks from the datasheet and
its kernel times from the kernel-dependent model fitted across the GPUs
DeepBench timed (:mod:`costmodel.kernel_model`, the ``"datasheet"`` ensembles,
which see a GPU only through its FP32 peak and memory bandwidth).
``python -m experiments.gpu_kernels --report`` validates it leave-one-GPU-out:
fitted on five of DeepBench's six GPUs, it predicts the sixth from that GPU's
datasheet.
"""

from __future__ import annotations

import numbers

import numpy as np

from .errors import CostModelError
from .hardware import DevicePreset

#: Seconds every op costs on a GPU besides its kernel (TensorFlow's executor and the launch),
#: as in the named GPU presets.
GPU_OVERHEAD = 10e-6


def _figure(value, field: str, name, *, optional=False):
    """``value`` as a positive finite float, or a :class:`CostModelError` naming ``field``."""
    if value is None:
        if optional:
            return None
        raise CostModelError(f"gpu_from_datasheet({name!r}): {field} is missing")
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise CostModelError(f"gpu_from_datasheet({name!r}): {field} must be a number, got "
                             f"{type(value).__name__} {value!r}")
    value = float(value)
    if not (np.isfinite(value) and value > 0):
        raise CostModelError(f"gpu_from_datasheet({name!r}): {field} must be finite and > 0, "
                             f"got {value!r}")
    return value


def gpu_from_datasheet(name, peak_flops, memory_bandwidth, memory, tensor_flops=None, *,
                       overhead: float = GPU_OVERHEAD, source: str = "") -> DevicePreset:
    """A preset for a GPU from its datasheet figures.

    Parameters
    ----------
    name : str
        The preset's name.
    peak_flops : float
        FP32 FLOP/s.
    memory_bandwidth : float
        Bytes/s of device memory.
    memory : float
        Bytes of device memory.
    tensor_flops : float, optional
        TF32 tensor-core FLOP/s (dense), for Ampere and later. Given, the preset
        runs TensorFlow's tensor-core ops at it by default (TF32 on), at the
        assumed efficiency 0.6: no published TF32 kernel times were fitted.
    overhead : float
        Seconds per op besides its kernel.
    source : str
        Where the figures come from (kept in the preset's ``source``).

    Returns
    -------
    DevicePreset
        FP32 convolutions and MatMuls timed by the ``"datasheet"`` kernel model,
        other ops by the roofline (memory-bound ops at 0.7 of the bandwidth).

    Raises
    ------
    CostModelError
        If ``name`` is not a non-empty string, or a figure is missing (None), not
        a number, not finite or not positive; the message names the figure.

    Examples
    --------
    >>> t4 = gpu_from_datasheet("t4", peak_flops=8.1e12, memory_bandwidth=320e9, memory=16e9)
    >>> t4.kernel_model, t4.precision
    ('datasheet', 'fp32')
    >>> gpu_from_datasheet("x", peak_flops=-1, memory_bandwidth=320e9, memory=16e9)
    Traceback (most recent call last):
    ...
    costmodel.errors.CostModelError: gpu_from_datasheet('x'): peak_flops must be finite and > 0, got -1.0
    """
    if not isinstance(name, str) or not name.strip():
        raise CostModelError(f"gpu_from_datasheet: name must be a non-empty string, got {name!r}")
    peak = _figure(peak_flops, "peak_flops", name)
    bandwidth = _figure(memory_bandwidth, "memory_bandwidth", name)
    mem = _figure(memory, "memory", name)
    tensor = _figure(tensor_flops, "tensor_flops", name, optional=True)
    if not (isinstance(overhead, numbers.Real) and np.isfinite(overhead) and overhead >= 0):
        raise CostModelError(f"gpu_from_datasheet({name!r}): overhead must be finite and >= 0, "
                             f"got {overhead!r}")
    note = (f"{source + ': ' if source else ''}datasheet {peak / 1e12:.3g} TFLOPS FP32"
            f"{f', {tensor / 1e12:.3g} TFLOPS TF32' if tensor else ''}, {bandwidth / 1e9:.4g} GB/s, "
            f"{mem / 1e9:.3g} GB (gpu_from_datasheet); FP32 convolutions and MatMuls by the kernel "
            f"model fitted across DeepBench's GPUs from their datasheets; other ops at the assumed "
            f"0.6 compute / 0.7 memory efficiency; overhead {overhead * 1e6:.3g} us per op")
    return DevicePreset(name, "GPU", peak_flops=peak, memory_bandwidth=bandwidth, memory=mem,
                        overhead=float(overhead), tensor_flops=tensor or 0.0, kernel_model="datasheet",
                        source=note)
