"""Inception-V3 (Szegedy et al., "Rethinking the Inception Architecture",
2016), as TF-Slim's ``nets/inception_v3.py`` builds it.

Every convolution is conv (no bias) + batch norm + ReLU; TF-Slim's Inception
arg-scope uses batch norm *without* gamma (``scale=False``, so only beta is
trainable), decay 0.9997, epsilon 0.001, and truncated-normal(0.1) weights.

Reference parameter counts (1000 classes, 299x299):

* without the auxiliary head: 23,817,352 trainable. Keras
  ``applications.InceptionV3`` (same layers, BN without gamma, no aux head)
  reports 23,851,784 parameters = 23,817,352 trainable + 34,432 moving
  mean/variance (checked with keras 3.15.1 here). We build exactly
  23,817,352 trainable; the ``REFERENCE_PARAMS`` check compares with the
  23,851,784 figure usually quoted (-0.14%).
* with the auxiliary head (TF-Slim's default, ``create_aux_logits=True``):
  23,817,352 + 3,325,800 = 27,143,152. (torchvision's 27,161,264 differs only
  because its batch norms also train gamma.)

Small inputs: the stem and the grid reductions use VALID convolutions and
pools, which leave nothing of a 32x32 image. Below 75x75 (Keras' minimum for
this network) every VALID becomes SAME, so a 32x32 input goes
32-16-16-16-8-8-8-4 (Mixed_5x) -2 (Mixed_6x) -1 (Mixed_7x). The layer
structure and op types are unchanged.
"""

from __future__ import annotations

import tensorflow as tf

from .layers import Layers, avg_pool, max_pool, reduced_kernel

v1 = tf.compat.v1

#: Keras ``InceptionV3(weights=None)`` total (trainable + BN moving stats), no
#: aux head. Our trainable count without aux head is 23,817,352.
REFERENCE_PARAMS = 23_851_784
#: TF-Slim ``inception_v3`` with aux head, BN beta only (computed from the
#: layer shapes of TF-Slim's definition).
REFERENCE_PARAMS_AUX = 27_143_152
DEFAULT_IMAGE_SIZE = 299
WEIGHT_DECAY = 4e-5  # TF-Slim inception_v3_arg_scope
MIN_VALID_SIZE = 75


def make_layers(seed: int, **_) -> Layers:
    """Slim's inception_v3_arg_scope: BN without gamma, trunc-normal(0.1)."""
    return Layers(seed, v1.truncated_normal_initializer(stddev=0.1),
                  bn_decay=0.9997, bn_epsilon=0.001, bn_scale=False)


def _concat(branches, name="concat"):
    return tf.concat(branches, axis=3, name=name)


def inception_v3(L: Layers, images: tf.Tensor, num_classes: int,
                 aux_head: bool = True, dropout_keep_prob: float = 0.8):
    """Build Inception-V3's forward pass.

    Args:
      L: the layer factory.
      images: ``[N, H, W, 3]`` float32 (299 for ImageNet; 32 works, see the
        module docstring).
      num_classes: width of the logits.
      aux_head: build the auxiliary classifier on Mixed_6e.
      dropout_keep_prob: keep probability before the logits.
    Returns:
      ``(logits, aux_logits or None)``, both ``[N, num_classes]``.
    """
    valid = "VALID" if min(images.shape[1:3]) >= MIN_VALID_SIZE else "SAME"

    def conv(x, filters, kernel, scope, stride=1, padding="SAME"):
        return L.conv_bn(x, filters, kernel, stride, padding, scope=scope)

    aux_logits = None
    with v1.variable_scope("InceptionV3"):
        # Stem: 299 -> 35x35x192.
        net = conv(images, 32, 3, "Conv2d_1a_3x3", stride=2, padding=valid)
        net = conv(net, 32, 3, "Conv2d_2a_3x3", padding=valid)
        net = conv(net, 64, 3, "Conv2d_2b_3x3")
        net = max_pool(net, 3, 2, valid, name="MaxPool_3a_3x3")
        net = conv(net, 80, 1, "Conv2d_3b_1x1", padding=valid)
        net = conv(net, 192, 3, "Conv2d_4a_3x3", padding=valid)
        net = max_pool(net, 3, 2, valid, name="MaxPool_5a_3x3")

        # 35x35 modules (figure 5): Mixed_5b (pool proj 32), 5c, 5d (64).
        for name, pool_proj in (("Mixed_5b", 32), ("Mixed_5c", 64),
                                ("Mixed_5d", 64)):
            with v1.variable_scope(name):
                with v1.variable_scope("Branch_0"):
                    b0 = conv(net, 64, 1, "Conv2d_0a_1x1")
                with v1.variable_scope("Branch_1"):
                    b1 = conv(net, 48, 1, "Conv2d_0a_1x1")
                    b1 = conv(b1, 64, 5, "Conv2d_0b_5x5")
                with v1.variable_scope("Branch_2"):
                    b2 = conv(net, 64, 1, "Conv2d_0a_1x1")
                    b2 = conv(b2, 96, 3, "Conv2d_0b_3x3")
                    b2 = conv(b2, 96, 3, "Conv2d_0c_3x3")
                with v1.variable_scope("Branch_3"):
                    b3 = avg_pool(net, 3, 1, "SAME", name="AvgPool_0a_3x3")
                    b3 = conv(b3, pool_proj, 1, "Conv2d_0b_1x1")
                net = _concat([b0, b1, b2, b3])

        # Grid reduction 35 -> 17.
        with v1.variable_scope("Mixed_6a"):
            with v1.variable_scope("Branch_0"):
                b0 = conv(net, 384, 3, "Conv2d_1a_1x1", stride=2,
                          padding=valid)
            with v1.variable_scope("Branch_1"):
                b1 = conv(net, 64, 1, "Conv2d_0a_1x1")
                b1 = conv(b1, 96, 3, "Conv2d_0b_3x3")
                b1 = conv(b1, 96, 3, "Conv2d_1a_1x1", stride=2, padding=valid)
            with v1.variable_scope("Branch_2"):
                b2 = max_pool(net, 3, 2, valid, name="MaxPool_1a_3x3")
            net = _concat([b0, b1, b2])

        # 17x17 modules with factorised 7x7 convolutions (figure 6).
        for name, d in (("Mixed_6b", 128), ("Mixed_6c", 160),
                        ("Mixed_6d", 160), ("Mixed_6e", 192)):
            with v1.variable_scope(name):
                with v1.variable_scope("Branch_0"):
                    b0 = conv(net, 192, 1, "Conv2d_0a_1x1")
                with v1.variable_scope("Branch_1"):
                    b1 = conv(net, d, 1, "Conv2d_0a_1x1")
                    b1 = conv(b1, d, [1, 7], "Conv2d_0b_1x7")
                    b1 = conv(b1, 192, [7, 1], "Conv2d_0c_7x1")
                with v1.variable_scope("Branch_2"):
                    b2 = conv(net, d, 1, "Conv2d_0a_1x1")
                    b2 = conv(b2, d, [7, 1], "Conv2d_0b_7x1")
                    b2 = conv(b2, d, [1, 7], "Conv2d_0c_1x7")
                    b2 = conv(b2, d, [7, 1], "Conv2d_0d_7x1")
                    b2 = conv(b2, 192, [1, 7], "Conv2d_0e_1x7")
                with v1.variable_scope("Branch_3"):
                    b3 = avg_pool(net, 3, 1, "SAME", name="AvgPool_0a_3x3")
                    b3 = conv(b3, 192, 1, "Conv2d_0b_1x1")
                net = _concat([b0, b1, b2, b3])

        if aux_head:
            aux_logits = _aux_head(L, net, num_classes, valid)

        # Grid reduction 17 -> 8.
        with v1.variable_scope("Mixed_7a"):
            with v1.variable_scope("Branch_0"):
                b0 = conv(net, 192, 1, "Conv2d_0a_1x1")
                b0 = conv(b0, 320, 3, "Conv2d_1a_3x3", stride=2, padding=valid)
            with v1.variable_scope("Branch_1"):
                b1 = conv(net, 192, 1, "Conv2d_0a_1x1")
                b1 = conv(b1, 192, [1, 7], "Conv2d_0b_1x7")
                b1 = conv(b1, 192, [7, 1], "Conv2d_0c_7x1")
                b1 = conv(b1, 192, 3, "Conv2d_1a_3x3", stride=2, padding=valid)
            with v1.variable_scope("Branch_2"):
                b2 = max_pool(net, 3, 2, valid, name="MaxPool_1a_3x3")
            net = _concat([b0, b1, b2])

        # 8x8 modules with expanded filter banks (figure 7).
        for name in ("Mixed_7b", "Mixed_7c"):
            with v1.variable_scope(name):
                with v1.variable_scope("Branch_0"):
                    b0 = conv(net, 320, 1, "Conv2d_0a_1x1")
                with v1.variable_scope("Branch_1"):
                    b1 = conv(net, 384, 1, "Conv2d_0a_1x1")
                    b1 = _concat([conv(b1, 384, [1, 3], "Conv2d_0b_1x3"),
                                  conv(b1, 384, [3, 1], "Conv2d_0b_3x1")])
                with v1.variable_scope("Branch_2"):
                    b2 = conv(net, 448, 1, "Conv2d_0a_1x1")
                    b2 = conv(b2, 384, 3, "Conv2d_0b_3x3")
                    b2 = _concat([conv(b2, 384, [1, 3], "Conv2d_0c_1x3"),
                                  conv(b2, 384, [3, 1], "Conv2d_0d_3x1")])
                with v1.variable_scope("Branch_3"):
                    b3 = avg_pool(net, 3, 1, "SAME", name="AvgPool_0a_3x3")
                    b3 = conv(b3, 192, 1, "Conv2d_0b_1x1")
                net = _concat([b0, b1, b2, b3])

        with v1.variable_scope("Logits"):
            # Slim pools with an 8x8 VALID kernel, shrunk for small inputs.
            net = avg_pool(net, reduced_kernel(net, 8), 1, "VALID",
                           name="AvgPool_1a")
            net = L.dropout(net, dropout_keep_prob, name="Dropout_1b")
            # Slim's 1x1 conv on the 1x1 map, as a MatMul (see resnet.py).
            net = tf.reshape(net, [int(net.shape[0]), -1], name="flatten")
            logits = L.dense(net, num_classes, scope="Conv2d_1c_1x1")
    return logits, aux_logits


def _aux_head(L: Layers, net: tf.Tensor, num_classes: int, valid: str):
    """Auxiliary classifier on Mixed_6e (17x17x768 at 299x299)."""
    with v1.variable_scope("AuxLogits"):
        aux = avg_pool(net, reduced_kernel(net, 5), 3, valid,
                       name="AvgPool_1a_5x5")
        aux = L.conv_bn(aux, 128, 1, scope="Conv2d_1b_1x1")
        # Slim initialises these two with small stddevs; kept for fidelity.
        init = L.weights_initializer
        L.weights_initializer = v1.truncated_normal_initializer(stddev=0.01)
        aux = L.conv_bn(aux, 768, reduced_kernel(aux, 5), padding="VALID",
                        scope="Conv2d_2a_5x5")
        L.weights_initializer = v1.truncated_normal_initializer(stddev=0.001)
        aux = tf.reshape(aux, [int(aux.shape[0]), -1], name="flatten")
        aux = L.dense(aux, num_classes, scope="Conv2d_2b_1x1")
        L.weights_initializer = init
        return aux
