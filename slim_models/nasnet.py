"""NASNet-A Large (Zoph et al., "Learning Transferable Architectures for
Scalable Image Recognition", 2018) and PNASNet-5 Mobile (Liu et al.,
"Progressive Neural Architecture Search", 2018), as TF-Slim's
``nets/nasnet/{nasnet,nasnet_utils,pnasnet}.py`` build them.

Both stack searched *cells*. A cell takes the two previous cell outputs
(``h[i-1]`` and ``h[i-2]``), brings them to ``filter_size`` channels and the
same spatial size (``_cell_base``), then runs five *combinations*: each
applies one operation to each of two hidden states and adds the results. The
cell output concatenates the hidden states no combination consumed. The
operations are

* ``separable_KxK_2``: twice ``relu -> separable conv (depthwise KxK +
  pointwise 1x1, no bias) -> BN`` (the first may be strided),
* ``max_pool_3x3`` / ``avg_pool_3x3`` (SAME), followed by a 1x1 conv + BN if
  the channel count differs,
* ``none``: identity, or ``relu -> strided 1x1 conv -> BN`` where needed.

In a stride-2 cell only operations on the two cell inputs stride. Drop-path
follows every operation except ``none``.

NASNet-A Large (``large_imagenet_config``): 18 normal cells (3 stacks of 6,
F=168), two reduction cells, and an ImageNet stem of a 3x3/2 VALID conv (96
filters) and two reduction cells (F/4, F/2): "6 @ 4032". PNASNet-5 Mobile
(``mobile_imagenet_config``): 9 cells (3 stacks of 3, F=54), the PNASNet cell
used for everything (stride 2 in the stem and at the two reductions), 32-filter
stem conv. Both: auxiliary head (loss weight 0.4) on the last cell before the
second reduction, dropout 0.5 before the logits, BN with gamma, decay 0.9997,
epsilon 0.001, weight decay 5e-5 (Large) / 4e-5 (Mobile).

Reference parameter counts (1000 classes, trainable, BN gamma and beta
counted, auxiliary head *not* counted, which is how the papers count):

* NASNet-A Large at 331x331: 88.9M (paper, Table 2; Keras
  ``applications.NASNetLarge`` reports 88,949,818 including 196,668 BN
  moving statistics, i.e. 88,753,150 trainable, checked with keras 3.15.1).
  We build exactly 88,753,150 trainable (-0.22% of 88,949,818).
* PNASNet-5 Mobile at 224x224: 5.1M (paper, Table 5; TF-Slim's README).
  We build 5,064,487 (-0.70%); with the auxiliary head, 7,477,263.

Differences from TF-Slim, all about determinism of the training step:

* drop-path uses the per-cell keep probability ``1 - (cell+1)/cells * (1 -
  keep)`` (Slim's ``drop_connect_version`` v2/v3 layer scaling) but not v3's
  ramp over ``global_step / total_training_steps``, and its per-example masks
  come from a stateless RNG with constant seeds (same every step and run);
* dropout likewise uses a constant stateless mask.

Small inputs: the auxiliary head's 5x5/3 VALID pool shrinks to the feature map
(Slim's rule for Inception); everything else already builds at 32x32
(32-15-8-4, cells at 4, 2 and 1).
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from .layers import (Layers, avg_pool, channels, max_pool, reduced_kernel,
                     spatial_size)

v1 = tf.compat.v1

#: NASNet-A paper, Table 2 (88.9M); Keras NASNetLarge total 88,949,818.
REFERENCE_PARAMS_NASNET_LARGE = 88_949_818
#: PNASNet paper, Table 5 / TF-Slim README: 5.1M.
REFERENCE_PARAMS_PNASNET_MOBILE = 5_100_000

# (operations, used hidden states, hidden-state indices) of each cell type,
# copied from TF-Slim's NasNetANormalCell, NasNetAReductionCell and
# PNasNetNormalCell.
NASNET_A_NORMAL = (
    ("separable_5x5_2", "separable_3x3_2", "separable_5x5_2",
     "separable_3x3_2", "avg_pool_3x3", "none", "avg_pool_3x3",
     "avg_pool_3x3", "separable_3x3_2", "none"),
    (1, 0, 0, 0, 0, 0, 0),
    (0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
)
NASNET_A_REDUCTION = (
    ("separable_5x5_2", "separable_7x7_2", "max_pool_3x3",
     "separable_7x7_2", "avg_pool_3x3", "separable_5x5_2", "none",
     "avg_pool_3x3", "separable_3x3_2", "max_pool_3x3"),
    (1, 1, 1, 0, 0, 0, 0),
    (0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
)
PNASNET_5 = (
    ("separable_5x5_2", "max_pool_3x3", "separable_7x7_2", "max_pool_3x3",
     "separable_5x5_2", "separable_3x3_2", "separable_3x3_2",
     "max_pool_3x3", "separable_3x3_2", "none"),
    (1, 1, 0, 0, 0, 0, 0),
    (1, 1, 0, 0, 0, 0, 4, 0, 1, 0),
)

# TF-Slim hparams (nasnet.large_imagenet_config,
# pnasnet.mobile_imagenet_config); the keys are build options.
NASNET_LARGE_CONFIG = dict(
    stem_multiplier=3.0, dense_dropout_keep_prob=0.5, num_cells=18,
    filter_scaling_rate=2.0, num_conv_filters=168, drop_path_keep_prob=0.7,
    aux_head=True, num_reduction_layers=2, skip_reduction_layer_input=True)
PNASNET_MOBILE_CONFIG = dict(
    stem_multiplier=1.0, dense_dropout_keep_prob=0.5, num_cells=9,
    filter_scaling_rate=2.0, num_conv_filters=54, drop_path_keep_prob=1.0,
    aux_head=True, num_reduction_layers=2, skip_reduction_layer_input=True)


def make_layers(seed: int, **_) -> Layers:
    """Slim's nasnet arg-scopes: He-normal fan-out weights, BN with gamma."""
    return Layers(seed, v1.variance_scaling_initializer(
        scale=2.0, mode="fan_out"), bn_decay=0.9997, bn_epsilon=0.001,
        bn_scale=True)


def calc_reduction_layers(num_cells: int, num_reduction_layers: int):
    """Indices of the cells preceded by a reduction (Slim's rule)."""
    return [int(float(k) / (num_reduction_layers + 1) * num_cells)
            for k in range(1, num_reduction_layers + 1)]


def factorized_reduction(L: Layers, x: tf.Tensor, filters: int,
                         stride: int) -> tf.Tensor:
    """Halve the spatial size without losing the odd pixels.

    Stride 1: 1x1 conv + BN. Stride 2: two 1x1/2 avg-pool + 1x1 conv paths,
    the second shifted by one pixel (pad right/bottom, crop top/left), their
    concatenation batch-normalised. An odd ``filters`` gives the extra
    channel to the second path.
    """
    if stride == 1:
        y = L.conv2d(x, filters, 1, scope="path_conv")
        return L.batch_norm(y, scope="path_bn")
    path1 = avg_pool(x, 1, stride, "VALID")
    path1 = L.conv2d(path1, filters // 2, 1, scope="path1_conv")
    path2 = tf.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])[:, 1:, 1:, :]
    path2 = avg_pool(path2, 1, stride, "VALID")
    path2 = L.conv2d(path2, filters // 2 + filters % 2, 1, scope="path2_conv")
    y = tf.concat([path1, path2], axis=3)
    return L.batch_norm(y, scope="final_path_bn")


class Cell:
    """One searched cell type (operations and wiring), applied many times.

    Args:
      spec: ``(operations, used_hiddenstates, hiddenstate_indices)``.
      num_conv_filters: F, the filter count at filter scaling 1.
      drop_path_keep_prob: keep probability of the last cell.
      total_num_cells: cells in the network (for the per-cell drop-path
        scaling).
    """

    def __init__(self, spec, num_conv_filters: int,
                 drop_path_keep_prob: float, total_num_cells: int):
        self.operations, self.used, self.indices = spec
        self.num_conv_filters = num_conv_filters
        self.drop_path_keep_prob = drop_path_keep_prob
        self.total_num_cells = total_num_cells

    def __call__(self, L: Layers, net: tf.Tensor, scope: str,
                 filter_scaling: float, stride: int,
                 prev_layer: Optional[tf.Tensor], cell_num: int) -> tf.Tensor:
        """Apply the cell.

        Args:
          L: the layer factory.
          net: output of the previous cell, ``h[i-1]``.
          scope: variable scope of this cell.
          filter_scaling: multiplies F to give this cell's filter size.
          stride: 2 for reduction (and stem) cells, else 1.
          prev_layer: ``h[i-2]``, or None (then ``h[i-1]`` is used).
          cell_num: position of the cell (drop-path scaling).
        Returns:
          the cell output (concatenation of the unused hidden states).
        """
        self.filter_size = int(self.num_conv_filters * filter_scaling)
        self.cell_num = cell_num
        with v1.variable_scope(scope):
            hidden = self._cell_base(L, net, prev_layer)
            for it in range(5):
                with v1.variable_scope(f"comb_iter_{it}"):
                    li, ri = self.indices[2 * it], self.indices[2 * it + 1]
                    with v1.variable_scope("left"):
                        h1 = self._apply_op(L, hidden[li],
                                            self.operations[2 * it],
                                            stride, li < 2)
                    with v1.variable_scope("right"):
                        h2 = self._apply_op(L, hidden[ri],
                                            self.operations[2 * it + 1],
                                            stride, ri < 2)
                    with v1.name_scope("combine"):
                        hidden.append(h1 + h2)
            with v1.variable_scope("cell_output"):
                return self._combine_unused_states(L, hidden)

    def _reduce_prev_layer(self, L, prev_layer, curr_layer):
        """Bring ``h[i-2]`` to ``h[i-1]``'s spatial size (factorized
        reduction) and to ``filter_size`` channels (1x1 conv + BN)."""
        if prev_layer is None:
            return curr_layer
        if spatial_size(prev_layer)[1] != spatial_size(curr_layer)[1]:
            return factorized_reduction(L, tf.nn.relu(prev_layer),
                                        self.filter_size, 2)
        if channels(prev_layer) != self.filter_size:
            y = L.conv2d(tf.nn.relu(prev_layer), self.filter_size, 1,
                         scope="prev_1x1")
            return L.batch_norm(y, scope="prev_bn")
        return prev_layer

    def _cell_base(self, L, net, prev_layer) -> List[tf.Tensor]:
        """The two initial hidden states: ``h[i-1]`` through relu, 1x1 conv
        and BN, and ``h[i-2]`` matched to it."""
        prev_layer = self._reduce_prev_layer(L, prev_layer, net)
        net = L.conv2d(tf.nn.relu(net), self.filter_size, 1, scope="1x1")
        net = L.batch_norm(net, scope="beginning_bn")
        return [net, prev_layer]

    def _apply_op(self, L, net, operation, stride, from_input):
        """Apply one named operation (see the module docstring) to a hidden
        state; returns a ``filter_size``-channel tensor."""
        # Only the cell's two inputs are strided in a reduction cell.
        if not from_input:
            stride = 1
        filters = self.filter_size
        if operation.startswith("separable"):
            kernel = int(operation.split("_")[1][0])
            layers = int(operation.split("_")[2])
            for k in range(1, layers + 1):
                net = tf.nn.relu(net)
                net = L.separable_conv2d(net, filters, kernel, stride,
                                         scope=f"separable_{kernel}x{kernel}_{k}")
                net = L.batch_norm(net, scope=f"bn_sep_{kernel}x{kernel}_{k}")
                stride = 1
        elif operation == "none":
            if stride > 1 or channels(net) != filters:
                net = L.conv2d(tf.nn.relu(net), filters, 1, stride,
                               scope="1x1")
                net = L.batch_norm(net, scope="bn_1")
        elif "pool" in operation:
            pool = max_pool if operation.startswith("max") else avg_pool
            in_filters = channels(net)
            net = pool(net, 3, stride, "SAME")
            if in_filters != filters:
                net = L.conv2d(net, filters, 1, scope="1x1")
                net = L.batch_norm(net, scope="bn_1")
        else:
            raise ValueError(f"unknown operation {operation}")
        if operation != "none" and self.drop_path_keep_prob < 1.0:
            ratio = (self.cell_num + 1) / float(self.total_num_cells)
            keep = 1.0 - ratio * (1.0 - self.drop_path_keep_prob)
            net = L.drop_path(net, keep)
        return net

    def _combine_unused_states(self, L, hidden):
        """Concatenate the hidden states no combination read, reducing any
        whose size or width differs from the last one's."""
        final_h = spatial_size(hidden[-1])[1]
        final_c = channels(hidden[-1])
        for idx, used in enumerate(self.used):
            if used:
                continue
            h = spatial_size(hidden[idx])[1]
            if h != final_h or channels(hidden[idx]) != final_c:
                with v1.variable_scope(f"reduction_{idx}"):
                    hidden[idx] = factorized_reduction(
                        L, hidden[idx], final_c, 2 if h != final_h else 1)
        return tf.concat([h for h, used in zip(hidden, self.used) if not used],
                         axis=3)


def _aux_head(L: Layers, net: tf.Tensor, num_classes: int, scope: str):
    """Auxiliary classifier: 5x5/3 avg pool, 1x1x128, kxkx768 (k = the map
    left), BN+ReLU after each, fully connected logits."""
    with v1.variable_scope(scope):
        with v1.variable_scope("aux_logits"):
            aux = avg_pool(net, reduced_kernel(net, 5), 3, "VALID")
            aux = L.conv2d(aux, 128, 1, scope="proj")
            aux = L.batch_norm(aux, activation=tf.nn.relu, scope="aux_bn0")
            aux = L.conv2d(aux, 768, spatial_size(aux), padding="VALID",
                           scope="Conv")
            aux = L.batch_norm(aux, activation=tf.nn.relu, scope="aux_bn1")
            aux = tf.reshape(aux, [int(aux.shape[0]), -1])
            return L.dense(aux, num_classes, scope="FC")


def _imagenet_stem(L: Layers, images, cfg, stem_cell: Cell):
    """3x3/2 VALID conv + BN, then two stride-2 cells at F/4 and F/2."""
    net = L.conv2d(images, int(32 * cfg["stem_multiplier"]), 3, 2, "VALID",
                   scope="conv0")
    net = L.batch_norm(net, scope="conv0_bn")
    cell_outputs: List[Optional[tf.Tensor]] = [None, net]
    scaling = 1.0 / cfg["filter_scaling_rate"] ** 2
    for k in range(2):
        net = stem_cell(L, net, f"cell_stem_{k}", scaling, 2,
                        cell_outputs[-2], k)
        cell_outputs.append(net)
        scaling *= cfg["filter_scaling_rate"]
    return net, cell_outputs


def nasnet(L: Layers, images: tf.Tensor, num_classes: int,
           variant: str = "nasnet_large", **options):
    """Build NASNet-A Large or PNASNet-5 Mobile's forward pass.

    Args:
      L: the layer factory.
      images: ``[N, H, W, 3]`` float32 (331 / 224 for ImageNet; 32 works).
      num_classes: width of the logits.
      variant: ``"nasnet_large"`` or ``"pnasnet_mobile"``.
      **options: overrides of the TF-Slim hparams in ``NASNET_LARGE_CONFIG``
        / ``PNASNET_MOBILE_CONFIG`` (e.g. ``num_cells=6`` for a smaller
        graph of the same kind, ``aux_head=False``).
    Returns:
      ``(logits, aux_logits or None)``, both ``[N, num_classes]``.
    """
    pnas = variant == "pnasnet_mobile"
    cfg = dict(PNASNET_MOBILE_CONFIG if pnas else NASNET_LARGE_CONFIG)
    unknown = set(options) - set(cfg)
    if unknown:
        raise TypeError(f"unknown {variant} options: {sorted(unknown)}")
    cfg.update(options)
    num_cells = cfg["num_cells"]
    # Slim counts the stem cells and (for NASNet) the reduction cells.
    total_num_cells = num_cells + 2 if pnas else num_cells + 4
    F, keep = cfg["num_conv_filters"], cfg["drop_path_keep_prob"]
    if pnas:
        normal = reduction = Cell(PNASNET_5, F, keep, total_num_cells)
    else:
        normal = Cell(NASNET_A_NORMAL, F, keep, total_num_cells)
        reduction = Cell(NASNET_A_REDUCTION, F, keep, total_num_cells)

    reductions = calc_reduction_layers(num_cells, cfg["num_reduction_layers"])
    aux_cells = [reductions[1] - 1] if len(reductions) >= 2 else []
    aux_logits = None
    with v1.variable_scope("pnasnet" if pnas else "nasnet"):
        net, cell_outputs = _imagenet_stem(L, images, cfg,
                                           normal if pnas else reduction)
        scaling = 1.0
        true_cell_num = 2
        prev_layer = None
        for c in range(num_cells):
            is_reduction = c in reductions
            if pnas:
                # PNASNet: the same cell, strided, does the reduction.
                if is_reduction:
                    scaling *= cfg["filter_scaling_rate"]
                if cfg["skip_reduction_layer_input"] or not is_reduction:
                    prev_layer = cell_outputs[-2]
                net = normal(L, net, f"cell_{c}", scaling,
                             2 if is_reduction else 1, prev_layer,
                             true_cell_num)
                true_cell_num += 1
                cell_outputs.append(net)
            else:
                if cfg["skip_reduction_layer_input"]:
                    prev_layer = cell_outputs[-2]
                if is_reduction:
                    scaling *= cfg["filter_scaling_rate"]
                    net = reduction(L, net,
                                    f"reduction_cell_{reductions.index(c)}",
                                    scaling, 2, cell_outputs[-2],
                                    true_cell_num)
                    true_cell_num += 1
                    cell_outputs.append(net)
                if not cfg["skip_reduction_layer_input"]:
                    prev_layer = cell_outputs[-2]
                net = normal(L, net, f"cell_{c}", scaling, 1, prev_layer,
                             true_cell_num)
                true_cell_num += 1
            if cfg["aux_head"] and c in aux_cells:
                aux_logits = _aux_head(L, tf.nn.relu(net), num_classes,
                                       f"aux_{c}")
            if not pnas:
                cell_outputs.append(net)

        with v1.variable_scope("final_layer"):
            net = tf.reduce_mean(tf.nn.relu(net), [1, 2])
            net = L.dropout(net, cfg["dense_dropout_keep_prob"],
                            name="dropout")
            logits = L.dense(net, num_classes, scope="FC")
    return logits, aux_logits
