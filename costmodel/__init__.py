"""The cost model fddps schedules by: profiled compute, communication and memory.

- :class:`CostModel` (``costmodel.base``): op times per device type, link
  latency/bandwidth between devices, op memory, device capacity; saved to and
  loaded from JSON.
- :func:`default_cost_model`: the built-in analytic model (this machine's CPU
  for CPU devices, the NVIDIA P100 for GPUs), used when nothing was profiled.
- :func:`gpu_from_datasheet`: a GPU preset from its datasheet figures.
- :func:`calibrate_cpu`: the CPU preset fitted to op times measured on this
  machine (``fddps calibrate``), cached per CPU; :func:`cached_cpu_calibration`
  reads it back, and :func:`default_cost_model` uses it when present.
- :data:`presets`: the named hardware presets (``"k80"``, ``"p100"``, ``"v100"``,
  ``"a100"``, ``"h100"``, ``"cpu"``; ``"h100:fp32"`` for TF32 off) and link presets (``"pcie3"``,
  ``"pcie4"``, ``"nvlink"``, ``"10gbe"``, ``"100gbe"``, ``"grpc-loopback"``).

This package never imports TensorFlow; measuring lives in
``fddps.tf.profiling`` and ``fddps.tf.comm_bench``.
"""

from .base import (DEFAULT_LINK_RULES, CostModel, OpTimeReport, ProfileCoverageWarning,
                   default_cost_model, graph_fingerprint)
from .devices import DeviceName, parse_device
from .errors import CostModelError, ProfileError, ProfileMismatchError
from .hardware import (NO_WORK_OPS, OP_CLASSES, TENSOR_CORE_OPS, DevicePreset, LinkPreset, Presets,
                       cpu_preset, op_class, presets)

__all__ = ["CostModel", "default_cost_model", "presets", "Presets", "DevicePreset", "LinkPreset",
           "cpu_preset", "graph_fingerprint", "OpTimeReport", "ProfileCoverageWarning",
           "DEFAULT_LINK_RULES", "NO_WORK_OPS", "TENSOR_CORE_OPS", "OP_CLASSES", "op_class",
           "parse_device", "DeviceName",
           "CostModelError", "ProfileError", "ProfileMismatchError"]

from .calibrate import (cache_path, cached_cpu_calibration, calibrate_cpu,  # noqa: E402
                        fit_cpu_preset)
from .datasheet import gpu_from_datasheet  # noqa: E402
from .memory import measured_transient, memory_summary  # noqa: E402
from .profile import Profile, iterated_mean, merge_profiles  # noqa: E402
from .regression import LinkModel, OpTimeModel, fit_cost_model  # noqa: E402

__all__ += ["Profile", "iterated_mean", "merge_profiles", "OpTimeModel", "LinkModel", "fit_cost_model",
            "measured_transient", "memory_summary", "gpu_from_datasheet", "calibrate_cpu",
            "cached_cpu_calibration", "fit_cpu_preset", "cache_path"]
