"""AlexNet, the single-tower variant of Krizhevsky's "One weird trick for
parallelizing convolutional neural networks" (arXiv:1404.5997, 2014), as
torchvision's ``models.alexnet`` builds it.

This is the AlexNet of the strategy-search papers' benchmarks (FlexFlow,
MLSys 2019, Table 4: "a 12-layer CNN", per-GPU batch 256; the
vertex-elimination DP paper's AlexNet): five convolutions with bias and ReLU,
three 3x3/2 max pools, then three fully connected layers (4096, 4096,
classes) with dropout 0.5 before the first two. No local response
normalisation and no grouped (two-tower) convolutions: those are the 2012
paper's (Krizhevsky, Sutskever & Hinton, NIPS 2012), whose two-GPU model has
60,965,224 parameters with 1000 classes; the single-tower one here has
61,100,840.

Layers (224x224 input; conv1 pads 2 on each side, the others SAME)::

    conv1 11x11/4,  64  -> 55x55   pool 3x3/2 -> 27x27
    conv2  5x5,    192  -> 27x27   pool 3x3/2 -> 13x13
    conv3  3x3,    384  -> 13x13
    conv4  3x3,    256  -> 13x13
    conv5  3x3,    256  -> 13x13   pool 3x3/2 -> 6x6
    fc6 9216 -> 4096, fc7 4096 -> 4096, fc8 4096 -> classes

Reference parameter count (1000 classes, 224x224): 61,100,840 (torchvision
``alexnet()``, i.e. the one-weird-trick paper's single-column net, "~61M").
Every weight is trainable and we build exactly that many.

Small inputs: the pools shrink their window to the map (TF-Slim's
``_reduced_kernel_size_for_small_input``), so CIFAR-size images build; fc6
covers the whole final map and its weight count follows the input size.
"""

from __future__ import annotations

import tensorflow as tf

from .layers import Layers, max_pool, reduced_kernel, spatial_size

v1 = tf.compat.v1

#: torchvision ``alexnet(num_classes=1000)``: the single-tower
#: "one weird trick" AlexNet (Krizhevsky 2014).
REFERENCE_PARAMS = 61_100_840
#: The 2012 paper's two-tower net (grouped conv2, conv4, conv5), for
#: comparison only: we build the single-tower variant.
REFERENCE_PARAMS_2012_TWO_TOWER = 60_965_224
DEFAULT_IMAGE_SIZE = 224
#: FlexFlow (MLSys 2019, section 8): "a per-GPU batch size of 64 for all DNN
#: benchmarks, except for AlexNet, which ... uses a per-GPU batch size of 256".
PER_GPU_BATCH = 256
WEIGHT_DECAY = 5e-4  # TF-Slim alexnet_v2_arg_scope / the 2012 paper
# (filters, kernel, stride, pool after) of the five convolutions.
_CONVS = ((64, 11, 4, True), (192, 5, 1, True), (384, 3, 1, False),
          (256, 3, 1, False), (256, 3, 1, True))


def make_layers(seed: int, **_) -> Layers:
    """AlexNet has no batch norm; weights use Glorot-uniform."""
    return Layers(seed, v1.glorot_uniform_initializer())


def _pool(net: tf.Tensor, name: str) -> tf.Tensor:
    """3x3/2 VALID max pool, the window shrunk to small maps."""
    kernel = reduced_kernel(net, 3)
    return max_pool(net, kernel, 2, name=name)


def alexnet(L: Layers, images: tf.Tensor, num_classes: int,
            dropout_keep_prob: float = 0.5):
    """Build AlexNet's forward pass.

    Args:
      L: the layer factory.
      images: ``[N, H, W, 3]`` float32, H and W at least 11 (224 for
        ImageNet).
      num_classes: width of the logits.
      dropout_keep_prob: keep probability of the dropouts before fc6 and fc7.
    Returns:
      ``(logits [N, num_classes], None)``: AlexNet has no auxiliary head.
    Raises:
      ValueError: images smaller than conv1's 11x11 window.
    """
    h, w = spatial_size(images)
    if h < 7 or w < 7:
        raise ValueError(f"alexnet needs images of at least 7x7 (conv1 is "
                         f"11x11 with 2 pixels of padding), got {h}x{w}")
    relu = tf.nn.relu
    with v1.variable_scope("alexnet"):
        net = images
        for i, (filters, kernel, stride, pool) in enumerate(_CONVS, start=1):
            if i == 1:
                # torchvision pads conv1 by 2 on each side (55x55 at 224).
                net = tf.pad(net, [[0, 0], [2, 2], [2, 2], [0, 0]],
                             name="conv1_pad")
                padding = "VALID"
            else:
                padding = "SAME"
            net = L.conv2d(net, filters, kernel, stride, padding, bias=True,
                           activation=relu, scope=f"conv{i}")
            if pool:
                net = _pool(net, name=f"pool{i}")
        net = tf.reshape(net, [int(net.shape[0]), -1], name="flatten")
        net = L.dropout(net, dropout_keep_prob, name="dropout6")
        net = relu(L.dense(net, 4096, scope="fc6"))
        net = L.dropout(net, dropout_keep_prob, name="dropout7")
        net = relu(L.dense(net, 4096, scope="fc7"))
        logits = L.dense(net, num_classes, scope="fc8")
    return logits, None
