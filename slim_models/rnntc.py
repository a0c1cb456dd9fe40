"""FlexFlow's text-classification RNN (RNNTC), statically unrolled.

Configuration and where it comes from (`FLEXFLOW_RNNTC`):

* FlexFlow (Jia et al., MLSys 2019), Section 8 and Table 4: "RNNTC uses four
  LSTM layers with a hidden size of 1024", "a softmax linear after the last
  LSTM layer", the Movie Reviews data set, and "the number of unrolling
  steps for each recurrent layer [is] 40".
* Movie Reviews is Pang and Lee's (2005) sentence-polarity data set, as Kim
  (2014) uses it (FlexFlow cites Kim 2014 for RNNTC's hyper-parameters):
  2 classes (positive, negative) and a vocabulary of 18,765 words (Kim 2014,
  Table 1, "MR": |V| = 18765). FlexFlow does not give the embedding width;
  as for its RNNLM and NMT, it equals the hidden size (1024).

The classifier reads the last LSTM layer's output at the last time step
(one sentence, one label), through one linear layer to the 2 classes; the
training step's loss is the softmax cross-entropy over them.

Parameters (`rnntc_parameter_count`): embedding ``V * E`` = 19,215,360;
four LSTM layers of ``4 H (in + H) + 4 H`` = 8,392,704 each (33,570,816);
softmax ``H * 2 + 2`` = 2,050; total 52,788,226. The built graph's trainable
variables must add up to that (``tests/test_flexflow.py``).

Example::

    import slim_models
    m = slim_models.build_training_graph("rnntc", 64)
"""

from __future__ import annotations

from typing import Dict, Optional

import tensorflow as tf

from .rnn import _embed, embedded_lstm_parameter_count, lstm_layer, make_layers  # noqa: F401

v1 = tf.compat.v1

#: FlexFlow's RNNTC (MLSys 2019, Section 8, Table 4); vocabulary and classes of
#: Movie Reviews as Kim (2014), Table 1, gives them.
FLEXFLOW_RNNTC = dict(num_layers=4, hidden_size=1024, vocab_size=18765, seq_length=40,
                      num_classes=2)


def rnntc_parameter_count(num_layers: int, hidden_size: int, vocab_size: int,
                          num_classes: int, embedding_size: Optional[int] = None,
                          **_) -> Dict[str, int]:
    """Parameters of `rnntc`, by part, from the shapes alone.

    Returns:
      ``{"embedding", "lstm", "softmax", "total"}``.
    """
    return embedded_lstm_parameter_count(num_layers, hidden_size, vocab_size, num_classes,
                                         embedding_size)


def rnntc(L, tokens: tf.Tensor, num_layers: int, hidden_size: int, vocab_size: int,
          num_classes: int, embedding_size: Optional[int] = None) -> tf.Tensor:
    """Forward pass: ``[N, T]`` word ids -> ``[N, num_classes]`` logits.

    Args:
      L: the layer factory (`slim_models.rnn.make_layers`).
      tokens: ``[N, T]`` int32 word ids; T is the number of unrolled steps.
      num_layers, hidden_size, vocab_size, num_classes: the model's size.
      embedding_size: width of the word vectors; None: ``hidden_size``.
    """
    e = hidden_size if embedding_size is None else int(embedding_size)
    with v1.variable_scope("rnntc"):
        x = _embed(L, tokens, vocab_size, e, "embedding")
        for k in range(num_layers):
            x, _ = lstm_layer(L, x, hidden_size, f"lstm_{k}")
        with v1.variable_scope("softmax"):
            w = L.variable("weights", [hidden_size, num_classes], L.weights_initializer)
            b = L.variable("biases", [num_classes], v1.zeros_initializer())
            return tf.nn.bias_add(tf.matmul(x[-1], w), b, name="logits")
