"""Small layer helpers shared by the model builders.

Every helper creates `tf.compat.v1` resource variables (through
`tf.compat.v1.get_variable(..., use_resource=True)`) and plain `tf.nn` ops, so
the graph holds exactly the ops a TF-Slim training graph of the same network
would hold, without depending on `tf_slim` or Keras.

A `Layers` object carries what TF-Slim keeps in arg-scopes and collections:

* the weight initializer and the batch-norm settings of the model,
* the weights that get L2 weight decay (``regularized``),
* the batch-norm moving-average updates (``bn_updates``), which the training
  graph runs with the optimizer step (TF-Slim's ``UPDATE_OPS``),
* a counter that gives every stateless random op (dropout, drop-path) its own
  constant seed, so that every step and every run sees the same masks.

Batch norm is `tf.compat.v1.nn.fused_batch_norm` in training mode (one
``FusedBatchNormV3`` op forward, one ``FusedBatchNormGradV3`` backward, as
TF-Slim's ``fused=True``); the moving mean and variance are updated with
``AssignSubVariableOp`` ops, ``moving -= (moving - batch_stat) * (1 - decay)``,
which is what ``assign_moving_average(..., zero_debias=False)`` builds.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import tensorflow as tf

v1 = tf.compat.v1

IntOrPair = Union[int, Sequence[int]]


def _pair(k: IntOrPair) -> List[int]:
    """Return a kernel size or stride as ``[h, w]``."""
    if isinstance(k, int):
        return [k, k]
    return [int(k[0]), int(k[1])]


def spatial_size(x: tf.Tensor) -> List[int]:
    """Static ``[height, width]`` of an NHWC tensor."""
    return [int(x.shape[1]), int(x.shape[2])]


def channels(x: tf.Tensor) -> int:
    """Static channel count of an NHWC tensor."""
    return int(x.shape[-1])


class Layers:
    """Layer factory holding one model's settings and side outputs.

    Args:
      seed: integer seed; the stateless dropout and drop-path masks use
        ``[seed, k]`` for the k-th random op built.
      weights_initializer: initializer for conv / fully-connected weights.
      bn_decay: moving-average decay of batch norm.
      bn_epsilon: batch-norm epsilon.
      bn_scale: whether batch norm has a trainable gamma (TF-Slim's
        ``scale``; False for Inception-V3, True for ResNet and NASNet).
      use_dropout: when False, `dropout` returns its input (no masks).
    """

    def __init__(self, seed: int, weights_initializer,
                 bn_decay: float = 0.997, bn_epsilon: float = 1e-5,
                 bn_scale: bool = True, use_dropout: bool = True):
        self.seed = int(seed)
        self.weights_initializer = weights_initializer
        self.bn_decay = bn_decay
        self.bn_epsilon = bn_epsilon
        self.bn_scale = bn_scale
        self.use_dropout = use_dropout
        self.regularized: List[tf.Variable] = []
        self.bn_updates: List[tf.Operation] = []
        self._random_ops = 0

    # ------------------------------------------------------------------ utils
    def stateless_seed(self) -> tf.Tensor:
        """A fresh constant seed ``[seed, k]`` for one stateless random op."""
        self._random_ops += 1
        return tf.constant([self.seed, 1000 + self._random_ops], tf.int64,
                           name="seed")

    def variable(self, name: str, shape: Sequence[int], initializer,
                 trainable: bool = True, regularize: bool = False):
        """Create a resource variable in the current variable scope."""
        var = v1.get_variable(name, shape=list(shape), dtype=tf.float32,
                              initializer=initializer, trainable=trainable,
                              use_resource=True)
        if regularize:
            self.regularized.append(var)
        return var

    # ------------------------------------------------------------- core ops
    def conv2d(self, x: tf.Tensor, filters: int, kernel: IntOrPair,
               stride: IntOrPair = 1, padding: str = "SAME",
               bias: bool = False, activation=None,
               scope: Optional[str] = "Conv") -> tf.Tensor:
        """2-D convolution (NHWC) with optional bias and activation.

        Args:
          x: input ``[N, H, W, C]``.
          filters: output channels.
          kernel, stride: int or ``[h, w]``.
          padding: ``"SAME"`` or ``"VALID"``.
          bias: add a trainable bias (TF-Slim adds one when the conv has no
            normalizer).
          activation: applied last, or None.
          scope: variable scope, or None to use the current one.
        Returns:
          the output tensor.
        """
        if scope is not None:
            with v1.variable_scope(scope):
                return self.conv2d(x, filters, kernel, stride, padding, bias,
                                   activation, scope=None)
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        w = self.variable("weights", [kh, kw, channels(x), filters],
                          self.weights_initializer, regularize=True)
        y = tf.nn.conv2d(x, w, [1, sh, sw, 1], padding)
        if bias:
            b = self.variable("biases", [filters], v1.zeros_initializer())
            y = tf.nn.bias_add(y, b)
        if activation is not None:
            y = activation(y)
        return y

    def separable_conv2d(self, x: tf.Tensor, filters: int, kernel: int,
                         stride: int = 1, scope: str = "separable") -> tf.Tensor:
        """Depthwise (multiplier 1) then pointwise conv, no bias.

        This is TF-Slim's ``separable_conv2d(..., depth_multiplier=1)`` under
        the NASNet arg-scope (``biases_initializer=None``, no normalizer);
        the stride applies to the depthwise step.
        """
        with v1.variable_scope(scope):
            dw = self.variable("depthwise_weights",
                               [kernel, kernel, channels(x), 1],
                               self.weights_initializer, regularize=True)
            pw = self.variable("pointwise_weights",
                               [1, 1, channels(x), filters],
                               self.weights_initializer, regularize=True)
            y = tf.nn.separable_conv2d(x, dw, pw, [1, stride, stride, 1],
                                       "SAME")
        return y

    def batch_norm(self, x: tf.Tensor, activation=None,
                   scope: str = "BatchNorm",
                   scale: Optional[bool] = None) -> tf.Tensor:
        """Training-mode fused batch norm with moving-average updates.

        Args:
          x: NHWC input.
          activation: applied after normalisation, or None.
          scope: variable scope name.
          scale: override the model's ``bn_scale`` (trainable gamma).
        Returns:
          the normalised tensor. The update ops of the moving mean and
          variance are appended to ``self.bn_updates``.
        """
        scale = self.bn_scale if scale is None else scale
        c = channels(x)
        with v1.variable_scope(scope):
            beta = self.variable("beta", [c], v1.zeros_initializer())
            if scale:
                gamma = self.variable("gamma", [c], v1.ones_initializer())
            else:
                # TF-Slim feeds a constant 1 when scale=False.
                gamma = tf.ones([c], tf.float32, name="gamma")
            moving_mean = self.variable("moving_mean", [c],
                                        v1.zeros_initializer(),
                                        trainable=False)
            moving_var = self.variable("moving_variance", [c],
                                       v1.ones_initializer(), trainable=False)
            y, mean, var = v1.nn.fused_batch_norm(
                x, gamma, beta, epsilon=self.bn_epsilon, is_training=True)
            with v1.name_scope("AssignMovingAvg"):
                k = 1.0 - self.bn_decay
                self.bn_updates.append(moving_mean.assign_sub(
                    (moving_mean - mean) * k, read_value=False))
                self.bn_updates.append(moving_var.assign_sub(
                    (moving_var - var) * k, read_value=False))
            if activation is not None:
                y = activation(y)
        return y

    def conv_bn(self, x: tf.Tensor, filters: int, kernel: IntOrPair,
                stride: IntOrPair = 1, padding: str = "SAME",
                activation=tf.nn.relu, scope: str = "Conv") -> tf.Tensor:
        """Conv (no bias) + batch norm + activation: TF-Slim's ``conv2d`` with
        ``normalizer_fn=batch_norm``; variables live under ``scope`` and
        ``scope/BatchNorm`` like TF-Slim's."""
        with v1.variable_scope(scope):
            y = self.conv2d(x, filters, kernel, stride, padding, scope=None)
            return self.batch_norm(y, activation=activation)

    def dense(self, x: tf.Tensor, units: int, scope: str = "fc") -> tf.Tensor:
        """Fully connected layer with bias and no activation (logits)."""
        with v1.variable_scope(scope):
            w = self.variable("weights", [int(x.shape[-1]), units],
                              self.weights_initializer, regularize=True)
            b = self.variable("biases", [units], v1.zeros_initializer())
            return tf.nn.bias_add(tf.linalg.matmul(x, w), b)

    def dropout(self, x: tf.Tensor, keep_prob: float,
                name: str = "Dropout") -> tf.Tensor:
        """Dropout with a fixed stateless mask (same on every step and run)."""
        if not self.use_dropout or keep_prob >= 1.0:
            return x
        with v1.name_scope(name):
            return tf.nn.experimental.stateless_dropout(
                x, rate=1.0 - keep_prob, seed=self.stateless_seed())

    def drop_path(self, x: tf.Tensor, keep_prob: float,
                  name: str = "drop_path") -> tf.Tensor:
        """NASNet drop-path: zero whole examples of a cell branch.

        ``x * (1 / keep_prob) * floor(keep_prob + U[0, 1))`` with a per-example
        mask drawn from a stateless RNG with a constant seed.
        """
        if not self.use_dropout or keep_prob >= 1.0:
            return x
        with v1.name_scope(name):
            noise = tf.random.stateless_uniform(
                [int(x.shape[0]), 1, 1, 1], seed=self.stateless_seed())
            mask = tf.floor(keep_prob + noise)
            return x * (1.0 / keep_prob) * mask


# ---------------------------------------------------------------- pooling
def max_pool(x: tf.Tensor, kernel: IntOrPair, stride: IntOrPair,
             padding: str = "VALID", name: str = "MaxPool") -> tf.Tensor:
    """NHWC max pooling (TF-Slim's default padding is VALID)."""
    return tf.nn.max_pool2d(x, _pair(kernel), _pair(stride), padding,
                            name=name)


def avg_pool(x: tf.Tensor, kernel: IntOrPair, stride: IntOrPair,
             padding: str = "VALID", name: str = "AvgPool") -> tf.Tensor:
    """NHWC average pooling."""
    return tf.nn.avg_pool2d(x, _pair(kernel), _pair(stride), padding,
                            name=name)


def reduced_kernel(x: tf.Tensor, kernel: IntOrPair) -> List[int]:
    """TF-Slim's ``_reduced_kernel_size_for_small_input``: shrink a kernel to
    the input's spatial size so small inputs (CIFAR) still build."""
    kh, kw = _pair(kernel)
    h, w = spatial_size(x)
    return [min(kh, h), min(kw, w)]
