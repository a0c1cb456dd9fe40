"""VGG-16 (Simonyan & Zisserman, 2015, configuration D), as TF-Slim's
``nets/vgg.py:vgg_16`` builds it.

Thirteen 3x3 convolutions with bias and ReLU in five blocks, each block ending
in a 2x2/2 max pool, then three fully connected layers (4096, 4096, classes)
with dropout 0.5 after the first two. No batch norm.

TF-Slim writes the fully connected layers as convolutions (fc6 a 7x7 VALID
conv over the 7x7 map, fc7/fc8 1x1 convs). We write them as flatten + MatMul,
as the VGG paper and Keras do: same weights (count and layout up to a
reshape), same math, but TensorFlow 2.21's CPU ``Conv2DBackpropInput`` /
``Conv2DBackpropFilter`` on a 1x1 output map run one GEMV per example over the
whole filter, which made fc7's gradient alone take ~25 s of a batch-64 step
(a MatMul of the same size takes ~0.2 s).

Reference parameter count (1000 classes, 224x224): 138,357,544 (the VGG paper's
"138M"; Keras ``applications.VGG16`` reports exactly 138,357,544, checked
with keras 3.15.1; TF-Slim's conv-as-fc layout has the same count). All of
them are trainable, and we build exactly that many.

Small inputs: fc6 covers the whole final map (7x7x512 at 224x224, 1x1x512 at
32x32), so its weight count follows the input size.
"""

from __future__ import annotations

import tensorflow as tf

from .layers import Layers, max_pool, spatial_size

v1 = tf.compat.v1

#: Keras ``VGG16(weights=None)`` / the VGG paper (Table 2, "138M").
REFERENCE_PARAMS = 138_357_544
DEFAULT_IMAGE_SIZE = 224
WEIGHT_DECAY = 5e-4  # TF-Slim vgg_arg_scope
# (number of convs, filters) of the five blocks.
_BLOCKS = ((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))


def make_layers(seed: int, **_) -> Layers:
    """VGG has no batch norm; weights use Glorot-uniform (Slim's xavier)."""
    return Layers(seed, v1.glorot_uniform_initializer())


def vgg16(L: Layers, images: tf.Tensor, num_classes: int,
          dropout_keep_prob: float = 0.5):
    """Build VGG-16's forward pass.

    Args:
      L: the layer factory.
      images: ``[N, H, W, 3]`` float32, H and W at least 32 (224 for
        ImageNet).
      num_classes: width of the logits.
      dropout_keep_prob: keep probability of the fc6/fc7 dropouts.
    Returns:
      ``(logits [N, num_classes], None)``: VGG has no auxiliary head.
    """
    relu = tf.nn.relu
    with v1.variable_scope("vgg_16"):
        net = images
        for b, (n, filters) in enumerate(_BLOCKS, start=1):
            with v1.variable_scope(f"conv{b}"):
                for i in range(1, n + 1):
                    net = L.conv2d(net, filters, 3, bias=True,
                                   activation=relu, scope=f"conv{b}_{i}")
            net = max_pool(net, 2, 2, name=f"pool{b}")
        h, w = spatial_size(net)
        if h > 7 or w > 7:
            raise ValueError(
                f"vgg16 expects a final map of at most 7x7 (224x224 input), "
                f"got {h}x{w}")
        net = tf.reshape(net, [int(net.shape[0]), -1], name="flatten")
        net = tf.nn.relu(L.dense(net, 4096, scope="fc6"))
        net = L.dropout(net, dropout_keep_prob, name="dropout6")
        net = tf.nn.relu(L.dense(net, 4096, scope="fc7"))
        net = L.dropout(net, dropout_keep_prob, name="dropout7")
        logits = L.dense(net, num_classes, scope="fc8")
    return logits, None
