"""Parse TensorFlow device strings into host, device type and index.

The cost model needs to know whether two devices share a host (links inside a
host are faster than links between hosts) and what type each device is. A host
is TensorFlow's ``(job, replica, task)``; a string without a job is a device of
the local process (``/job:localhost/replica:0/task:0``).

Examples
--------
>>> parse_device("/job:worker/replica:0/task:1/device:CPU:0")
DeviceName(job='worker', replica=0, task=1, type='CPU', index=0)
>>> parse_device("/gpu:3").host
('localhost', 0, 0)
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import CostModelError

LOCAL_JOB = "localhost"


class DeviceName(NamedTuple):
    """A parsed device string: host parts, device type (upper case) and index."""

    job: str
    replica: int
    task: int
    type: str
    index: int

    @property
    def host(self) -> tuple:
        """``(job, replica, task)``: devices with equal hosts share a machine/process."""
        return (self.job, self.replica, self.task)

    def __str__(self):
        return (f"/job:{self.job}/replica:{self.replica}/task:{self.task}"
                f"/device:{self.type}:{self.index}")


def parse_device(name: str) -> DeviceName:
    """Parse a TensorFlow device string.

    Accepts the full form ``/job:J/replica:R/task:T/device:TYPE:I``, any subset
    of its parts, and the legacy ``/cpu:0`` / ``/gpu:1`` forms. Missing parts
    default to the local process and index 0.

    Raises
    ------
    CostModelError
        If ``name`` is not a string or a part cannot be read; the message names it.
    """
    if not isinstance(name, str) or not name.strip():
        raise CostModelError(f"a device name must be a non-empty string, got {name!r}")
    job, replica, task, dtype, index = LOCAL_JOB, 0, 0, None, 0
    try:
        for part in filter(None, name.strip().split("/")):
            key, _, rest = part.partition(":")
            key_l = key.lower()
            if key_l == "job":
                job = rest
            elif key_l == "replica":
                replica = int(rest)
            elif key_l == "task":
                task = int(rest)
            elif key_l == "device":
                t, _, i = rest.partition(":")
                dtype, index = t.upper(), int(i) if i not in ("", "*") else 0
            elif rest and rest.replace("*", "0").isdigit() and key.isalpha():
                dtype, index = key.upper(), int(rest.replace("*", "0"))
            else:
                raise ValueError(part)
    except ValueError as err:
        raise CostModelError(f"cannot read device name {name!r} (bad part {err.args[0]!r})") from None
    if dtype is None:
        raise CostModelError(f"device name {name!r} has no device type (e.g. '/device:CPU:0')")
    return DeviceName(job, replica, task, dtype, index)
