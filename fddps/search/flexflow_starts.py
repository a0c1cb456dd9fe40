"""The strategies FlexFlow's evaluation starts from and compares against (MLSys 2019, 6.2, 8.1).

- :func:`sample_parallel`: data parallelism as FlexFlow's runtime runs it:
  :func:`~fddps.strategy.data_parallel` with TensorFlow's gradient-tuple
  ``Identity`` ops (a colocation group without a variable) split by sample
  like the gradient they pass on. :func:`~fddps.strategy.data_parallel`
  keeps every tied op whole, so each activation gradient is gathered whole
  onto one device and sent on (AlexNet at batch 4,096 on 16 P100s: ~30 GB
  moved per step, ~18 of them such gathers); FlexFlow has no such ops.
- :func:`expert_strategy`: the expert-designed strategies of Section 8.1.
  CNNs (Krizhevsky, 2014): data parallelism for convolutions and pools,
  model parallelism (a parameter split over every device) for the densely
  connected layers. RNNs (Wu et al., 2016): the graph replicated per node
  (data parallelism across nodes) and, inside a node, the ops of one depth
  (an LSTM layer, the embedding, the attention, the softmax) on one GPU.
- :func:`random_strategy`: every decision unit a random configuration (a
  split from :func:`~fddps.search.space.unit_splits`, its parts on random
  distinct devices): the paper's random initial candidate.

Example
-------
>>> from fddps.strategy.graph import OpInfo, StepGraph
>>> g = StepGraph([OpInfo("y", "Relu", input_shapes=((4, 8),), output_shapes=((4, 8),))])
>>> sample_parallel(g, ["a", "b"]).config("y").split
{}
"""

from __future__ import annotations

import re

import numpy as np

from ..strategy.ops import NotDescribed, resolve
from ..strategy.strategy import (VARIABLE_TYPES, OpConfig, Strategy, combine, data_parallel,
                                 group_devices, parameter_split, sample_dim)
from .space import decision_units, unit_splits


def _groups(step) -> dict:
    out = {}
    for name, op in step.ops.items():
        if op.tied and op.group is not None:
            out.setdefault(op.group, []).append(name)
    return out


def _sample_letter(op, batch):
    try:
        return sample_dim(resolve(op), batch)
    except NotDescribed:
        return None


def sample_parallel(step, devices) -> Strategy:
    """Data parallelism with variable-free colocation groups split by sample too.

    Parameters
    ----------
    step : StepGraph
    devices : sequence of str

    Returns
    -------
    Strategy
        :func:`~fddps.strategy.data_parallel`'s, where every tied op of a
        colocation group holding no variable is split by sample as its
        untied producer is, when all of the group's tied ops have the same
        sample dimension (else the group stays as data parallelism has it).
    """
    devices = list(devices)
    dp = data_parallel(step, devices)
    batch = step.batch_size
    k = min(len(devices), batch or 1)
    configs = dict(dp.configs)
    if k > 1:
        for group, names in _groups(step).items():
            if any(step.ops[n].op_type in VARIABLE_TYPES for n in names):
                continue
            letters = {_sample_letter(step.ops[n], batch) for n in names}
            if len(letters) == 1 and None not in letters:
                cfg = OpConfig({letters.pop(): k}, tuple(devices[:k]))
                for n in names:
                    configs[n] = cfg
    return Strategy(configs, dp.default_device, name="data parallel")


def is_cnn(step) -> bool:
    """Whether the step convolves (the CNN expert strategy applies, else the RNN one)."""
    return any(op.op_type.startswith("Conv2D") for op in step.ops.values())


#: Scopes that mark an op's depth in the sequence models (``rnn_lm``, ``rnntc``, ``nmt``),
#: in order: the embeddings, each LSTM layer (encoder before decoder), attention, softmax.
_DEPTH = re.compile(r"(encoder|decoder)?/?(embedding|lstm_(\d+)|attention|softmax)")


def _depth_key(name):
    """``(part, rank)`` of an op's depth block from its name, or None."""
    m = None
    for m in _DEPTH.finditer(name):
        pass  # the innermost (last) match names the block
    if m is None:
        return None
    side = {"encoder": 0, None: 0, "decoder": 1}[m.group(1)]
    what = m.group(2)
    if what == "embedding":
        return (side, 0, 0)
    if what.startswith("lstm_"):
        return (side, 1, int(m.group(3)))
    return (2, 0 if what == "attention" else 1, 0)


def expert_strategy(step, devices, hosts=None) -> Strategy:
    """FlexFlow's expert-designed baseline (Section 8.1) for ``step`` on ``devices``.

    Parameters
    ----------
    step : StepGraph
    devices : sequence of str
    hosts : sequence of str, optional
        Each device's host (default: all on one). The RNN strategy replicates
        the graph once per host.

    Returns
    -------
    Strategy
        CNN: :func:`sample_parallel` with every ``MatMul`` (the dense layers,
        forward and both backprops) split by parameter over all devices.
        RNN: per host a replica (each op with a sample dimension split by
        sample into one part per host), the ops of the ``j``-th of ``B`` depth
        blocks on GPU ``floor(j * G / B)`` of each host (``G`` GPUs per host);
        variables whole, spread over the hosts by bytes, on their block's GPU.
    """
    devices = list(devices)
    if is_cnn(step):
        dp = sample_parallel(step, devices)
        ps = parameter_split(step, devices, op_types=["MatMul"])
        s = combine(ps, dp, name="expert")
        return s
    hosts = list(hosts) if hosts is not None else ["0"] * len(devices)
    by_host = {}
    for d, h in zip(devices, hosts):
        by_host.setdefault(h, []).append(d)
    nodes = list(by_host.values())
    per = min(len(n) for n in nodes)
    keys = sorted({k for k in map(_depth_key, step.ops) if k is not None})
    gpu_of_key = {key: (j * per) // max(len(keys), 1) for j, key in enumerate(keys)}
    batch = step.batch_size
    parts = min(len(nodes), batch or 1)
    groups = _groups(step)
    var_groups = {g for g, names in groups.items()
                  if any(step.ops[n].op_type in VARIABLE_TYPES for n in names)}
    node_of_group = group_devices(step, list(range(len(nodes))), var_groups)
    configs = {}

    def gpu(name, fallback=0):
        key = _depth_key(name)
        return gpu_of_key[key] if key is not None else fallback

    def decide(name):
        op = step.ops[name]
        src = op.inputs[0][0] if op.inputs else None
        g = gpu(name, configs[src].devices[0] if src in configs else 0)
        if isinstance(g, str):  # a producer's device: its index on its host
            g = next(i for n in nodes for i, d in enumerate(n) if d == g)
        letter = _sample_letter(op, batch)
        if parts > 1 and letter is not None:
            return OpConfig({letter: parts}, tuple(nodes[h][g] for h in range(parts)))
        return OpConfig({}, (nodes[0][g],))

    for name, op in step.ops.items():
        if name in configs:
            continue
        if op.tied and op.group in groups:
            members = groups[op.group]
            if op.group in var_groups:
                cfg = OpConfig({}, (nodes[node_of_group.get(op.group, 0)][gpu(name)],))
            else:
                cfg = decide(name)
                letters = {_sample_letter(step.ops[n], batch) for n in members}
                if cfg.num_parts > 1 and letters != set(cfg.split):
                    cfg = OpConfig({}, cfg.devices[:1])
            for n in members:
                configs[n] = cfg
        else:
            configs[name] = decide(name)
    return Strategy(configs, devices[0], name="expert")


def random_strategy(step, devices, rng, units=None) -> Strategy:
    """A random configuration per decision unit (the paper's random initial strategy).

    ``units``: the decision units to draw for (default every unit of the
    step); the rest run whole on a random device.
    """
    devices = list(devices)
    k = len(devices)
    configs = {}
    drawn = None if units is None else set(units)
    for unit in decision_units(step):
        splits = unit_splits(step, unit, k) if drawn is None or unit in drawn else [{}]
        split = splits[int(rng.integers(len(splits)))]
        n = int(np.prod(list(split.values()))) if split else 1
        cfg = OpConfig(split, [devices[j] for j in rng.permutation(k)[:n]])
        for name in unit:
            configs[name] = cfg
    return Strategy(configs, devices[0], name="random")


__all__ = ["expert_strategy", "is_cnn", "random_strategy", "sample_parallel"]
