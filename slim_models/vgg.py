"""VGG-16 (Simonyan & Zisserman, 2015, configuration D), as TF-Slim's
``nets/vgg.py:vgg_16`` builds it.

Thirteen 3x3 convolutions with bias and ReLU in five blocks, each block ending
in a 2x2/2 max pool, then the three fully connected layers written as
convolutions (fc6 a 7x7 VALID conv over the 7x7 feature map, fc7 and fc8 1x1),
dropout 0.5 after fc6 and fc7. No batch norm.

Reference parameter count (1000 classes, 224x224): 138,357,544 (the VGG paper's
"138M"; Keras ``applications.VGG16`` reports exactly 138,357,544, TF-Slim's
conv-as-fc layout has the same count). All of them are trainable.

Small inputs: fc6's kernel shrinks to the final feature map (1x1 at 32x32), as
it must to cover the whole map; its weight count changes accordingly.
"""

from __future__ import annotations

import tensorflow as tf

from .layers import Layers, max_pool, reduced_kernel, spatial_size

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
      images: ``[N, H, W, 3]`` float32, H and W at least 32.
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
        kernel = reduced_kernel(net, 7)
        net = L.conv2d(net, 4096, kernel, padding="VALID", bias=True,
                       activation=relu, scope="fc6")
        if spatial_size(net) != [1, 1]:
            raise ValueError(
                f"vgg16 needs an input whose final map is at most 7x7, got "
                f"{images.shape[1]}x{images.shape[2]}")
        net = L.dropout(net, dropout_keep_prob, name="dropout6")
        net = L.conv2d(net, 4096, 1, bias=True, activation=relu, scope="fc7")
        net = L.dropout(net, dropout_keep_prob, name="dropout7")
        net = L.conv2d(net, num_classes, 1, bias=True, scope="fc8")
        logits = tf.squeeze(net, [1, 2], name="fc8/squeezed")
    return logits, None
