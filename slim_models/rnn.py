"""Recurrent models of the seed papers: an LSTM language model (``rnn_lm``)
and an encoder-decoder LSTM with attention (``nmt``), statically unrolled.

Every time step is written out with plain graph ops (``MatMul``,
``BiasAdd``, ``ConcatV2``, ``Split``, ``Sigmoid``, ``Tanh``, ``Mul``,
``AddV2``, ``Softmax``...): no ``tf.while_loop``, no fused RNN kernel, so a
training step is a plain DAG that fddps reads, costs and places op by op, as
Tofu and FlexFlow see an unrolled RNN.

LSTM cell (`lstm_layer`): TensorFlow's ``BasicLSTMCell`` layout, one kernel
``[input + hidden, 4 * hidden]`` and one bias ``[4 * hidden]`` per layer,
gates ``i, j, f, o = split(concat([x, h]) @ kernel + bias)``,
``c' = sigmoid(f + 1) * c + sigmoid(i) * tanh(j)``, ``h' = sigmoid(o) *
tanh(c')`` (forget bias 1.0); zero initial state. Parameters per layer:
``4 * hidden * (input + hidden) + 4 * hidden`` (`lstm_parameter_count`).

Configurations and where they come from:

* `FLEXFLOW_RNNLM` (FlexFlow, Jia et al., MLSys 2019, Section 8 / Table 4):
  "RNNLM uses two LSTM layers with a hidden size of 2048" and "a softmax
  linear after the last LSTM layer", Penn Treebank (10,000-word vocabulary),
  "the number of unrolling steps for each recurrent layer [is] 40". The
  embedding width equals the hidden size (FlexFlow's own code sets both to
  2048). 108,095,248 parameters (no figure given in the paper).
* Tofu's RNNs (Wang et al., EuroSys 2019, Section 7): the LSTM model of
  Jozefowicz et al. (2016) with 6, 8 or 10 layers of 4K, 6K or 8K hidden
  units, "unrolled for 20 steps" (`tofu_rnn_options`). Tofu's Table 2 gives
  the "total weight tensor sizes (GB)" (`TOFU_TABLE2_GIB`). Read as 12 bytes
  per parameter in GiB (weights, gradients, one optimizer slot; the reading
  that reproduces Tofu's wide-ResNet entries within 2%), the LSTM stack
  alone (L layers of ``8H^2 + 4H``) is 4-9% above every entry but RNN-8-6K
  (5% below, an outlier in the table's own progression); the other entries
  fit ``(2L - 1) * 4H^2`` parameters within 3%, i.e. as if the first layer
  had no H-wide input. Tofu does not state the vocabulary or
  embedding; we build the embedding and softmax at ``vocab_size`` and
  compare only the LSTM stack with the table.
* `FLEXFLOW_NMT` (FlexFlow, Section 8 and Figure 13): "an encoder and a
  decoder, both of which consist of 2 LSTM layers with a hidden size of
  1024", "an attention layer on top of the last decoder LSTM layer (Bahdanau
  et al., 2014)", 40 unrolling steps, WMT English-German; the vocabulary,
  20,480 words for source and target, is FlexFlow's ``nmt/nmt.cc``
  (``vocab_size = 20 * 1024``), the paper gives none.

Attention (`nmt`): additive (Bahdanau) scores ``v . tanh(K[s] + q_t)`` with
the keys ``K = enc @ W_key`` computed once and ``q_t = h_t @ W_query`` per
decoder step, ``softmax`` over the source steps, the context ``sum_s
alpha[s] * enc[s]``, and the attentional state ``tanh([context, h_t] @
W_out)`` (Luong et al.'s output layer) that feeds the softmax.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from .layers import Layers

v1 = tf.compat.v1

FORGET_BIAS = 1.0  # BasicLSTMCell's default
INIT_SCALE = 0.1  # uniform(-0.1, 0.1): Zaremba et al.'s PTB LSTM

#: FlexFlow's RNNLM (MLSys 2019, Table 4 and Section 8).
FLEXFLOW_RNNLM = dict(num_layers=2, hidden_size=2048, vocab_size=10000,
                      seq_length=40)
#: FlexFlow's NMT (MLSys 2019, Section 8, Figure 13; vocabulary from its
#: nmt/nmt.cc).
FLEXFLOW_NMT = dict(num_layers=2, hidden_size=1024, vocab_size=20480,
                    seq_length=40)
#: Tofu (EuroSys 2019) Table 2, "Total weight tensor sizes (GB)" of the RNNs:
#: ``{(layers, hidden): GiB}`` (4K = 4096).
TOFU_TABLE2_GIB = {
    (6, 4096): 8.4, (8, 4096): 11.4, (10, 4096): 14.4,
    (6, 6144): 18.6, (8, 6144): 28.5, (10, 6144): 32.1,
    (6, 8192): 33.0, (8, 8192): 45.3, (10, 8192): 57.0,
}
TOFU_RNN_STEPS = 20  # "unrolled for 20 steps"


def make_layers(seed: int, **_) -> Layers:
    """Uniform(-0.1, 0.1) weights (Zaremba et al.'s PTB setting), no weight
    decay, no batch norm."""
    return Layers(seed, v1.random_uniform_initializer(-INIT_SCALE, INIT_SCALE))


def tofu_rnn_options(layers: int, hidden: int,
                     vocab_size: int = 10000) -> Dict[str, int]:
    """``rnn_lm`` options of Tofu's RNN-``layers``-``hidden`` (20 steps).

    Tofu does not give the vocabulary; 10,000 (Penn Treebank, as FlexFlow's
    RNNLM) is our choice.
    """
    return dict(num_layers=int(layers), hidden_size=int(hidden),
                vocab_size=int(vocab_size), seq_length=TOFU_RNN_STEPS)


# ---------------------------------------------------------------- counting
def lstm_parameter_count(input_size: int, hidden_size: int) -> int:
    """Parameters of one `lstm_layer`: kernel and bias."""
    return 4 * hidden_size * (input_size + hidden_size) + 4 * hidden_size


def rnn_lm_parameter_count(num_layers: int, hidden_size: int,
                           vocab_size: int,
                           embedding_size: Optional[int] = None,
                           **_) -> Dict[str, int]:
    """Parameters of `rnn_lm`, by part, from the shapes alone.

    Returns:
      ``{"embedding", "lstm", "softmax", "total"}``.
    """
    return embedded_lstm_parameter_count(num_layers, hidden_size, vocab_size, vocab_size,
                                         embedding_size)


def embedded_lstm_parameter_count(num_layers: int, hidden_size: int, vocab_size: int,
                                  outputs: int, embedding_size: Optional[int] = None
                                  ) -> Dict[str, int]:
    """Parameters of an embedding, a stack of LSTM layers and a softmax over ``outputs``.

    Returns:
      ``{"embedding", "lstm", "softmax", "total"}``.
    """
    e = hidden_size if embedding_size is None else int(embedding_size)
    lstm = sum(lstm_parameter_count(e if k == 0 else hidden_size, hidden_size)
               for k in range(num_layers))
    parts = dict(embedding=vocab_size * e, lstm=lstm, softmax=hidden_size * outputs + outputs)
    parts["total"] = sum(parts.values())
    return parts


def nmt_parameter_count(num_layers: int, hidden_size: int, vocab_size: int,
                        embedding_size: Optional[int] = None,
                        attention_size: Optional[int] = None,
                        **_) -> Dict[str, int]:
    """Parameters of `nmt`, by part, from the shapes alone.

    Returns:
      ``{"embedding", "encoder", "decoder", "attention", "softmax",
      "total"}`` (embedding: source and target tables).
    """
    h = hidden_size
    e = h if embedding_size is None else int(embedding_size)
    a = h if attention_size is None else int(attention_size)
    stack = sum(lstm_parameter_count(e if k == 0 else h, h)
                for k in range(num_layers))
    parts = dict(embedding=2 * vocab_size * e, encoder=stack, decoder=stack,
                 attention=h * a + h * a + a + 2 * h * h,
                 softmax=h * vocab_size + vocab_size)
    parts["total"] = sum(parts.values())
    return parts


# ---------------------------------------------------------------- building
def lstm_layer(L: Layers, inputs: Sequence[tf.Tensor], hidden_size: int,
               scope: str, initial_state=None):
    """One statically unrolled LSTM layer.

    Args:
      L: the layer factory (creates the kernel and bias).
      inputs: one ``[N, input]`` tensor per time step.
      hidden_size: H.
      scope: variable scope of the kernel and bias; step t's ops are under
        ``scope/t<t>``.
      initial_state: ``(c, h)``, each ``[N, H]``; None: zeros.
    Returns:
      ``(outputs, (c, h))``: the ``[N, H]`` output of every step and the
      final state.
    """
    n, d = int(inputs[0].shape[0]), int(inputs[0].shape[1])
    with v1.variable_scope(scope):
        kernel = L.variable("kernel", [d + hidden_size, 4 * hidden_size],
                            L.weights_initializer)
        bias = L.variable("bias", [4 * hidden_size], v1.zeros_initializer())
        if initial_state is None:
            zeros = tf.zeros([n, hidden_size], tf.float32, name="zero_state")
            c, h = zeros, zeros
        else:
            c, h = initial_state
        outputs = []
        for t, x in enumerate(inputs):
            with v1.name_scope(f"t{t}"):
                z = tf.nn.bias_add(tf.matmul(tf.concat([x, h], 1), kernel),
                                   bias)
                i, j, f, o = tf.split(z, 4, axis=1)
                c = (tf.sigmoid(f + FORGET_BIAS) * c
                     + tf.sigmoid(i) * tf.tanh(j))
                h = tf.sigmoid(o) * tf.tanh(c)
            outputs.append(h)
    return outputs, (c, h)


def _embed(L: Layers, tokens: tf.Tensor, vocab_size: int, size: int,
           scope: str) -> List[tf.Tensor]:
    """Look ``tokens [N, T]`` up in a ``[vocab, size]`` table; one ``[N,
    size]`` tensor per step."""
    with v1.variable_scope(scope):
        table = L.variable("embedding", [vocab_size, size],
                           L.weights_initializer)
        vectors = tf.nn.embedding_lookup(table, tokens)
        return tf.unstack(vectors, axis=1)


def _softmax_logits(L: Layers, outputs: Sequence[tf.Tensor], vocab_size: int,
                    scope: str = "softmax") -> tf.Tensor:
    """One projection of every step's output to the vocabulary:
    ``[N, T, vocab]`` logits."""
    n, h = int(outputs[0].shape[0]), int(outputs[0].shape[1])
    stacked = tf.reshape(tf.stack(outputs, axis=1), [-1, h])
    with v1.variable_scope(scope):
        w = L.variable("weights", [h, vocab_size], L.weights_initializer)
        b = L.variable("biases", [vocab_size], v1.zeros_initializer())
        logits = tf.nn.bias_add(tf.matmul(stacked, w), b)
    return tf.reshape(logits, [n, len(outputs), vocab_size], name="logits")


def rnn_lm(L: Layers, tokens: tf.Tensor, num_layers: int, hidden_size: int,
           vocab_size: int, embedding_size: Optional[int] = None):
    """Forward pass of a multi-layer LSTM language model.

    Args:
      L: the layer factory.
      tokens: ``[N, T]`` int32 word ids; T is the number of unrolled steps.
      num_layers, hidden_size, vocab_size: the model's size.
      embedding_size: width of the word vectors; None: ``hidden_size``.
    Returns:
      ``[N, T, vocab_size]`` logits of the next word at every step.
    """
    e = hidden_size if embedding_size is None else int(embedding_size)
    with v1.variable_scope("rnn_lm"):
        x = _embed(L, tokens, vocab_size, e, "embedding")
        for k in range(num_layers):
            x, _ = lstm_layer(L, x, hidden_size, f"lstm_{k}")
        return _softmax_logits(L, x, vocab_size)


def _attention(L: Layers, encoder_outputs: Sequence[tf.Tensor],
               decoder_outputs: Sequence[tf.Tensor], attention_size: int):
    """Additive attention over the encoder steps for every decoder step;
    returns the attentional states ``tanh([context, h] @ W_out)``."""
    enc = tf.stack(encoder_outputs, axis=1)  # [N, S, H]
    n, s, h = (int(d) for d in enc.shape)
    w_key = L.variable("key_weights", [h, attention_size], L.weights_initializer)
    w_query = L.variable("query_weights", [h, attention_size],
                         L.weights_initializer)
    v = L.variable("score_weights", [attention_size], L.weights_initializer)
    w_out = L.variable("output_weights", [2 * h, h], L.weights_initializer)
    keys = tf.reshape(tf.matmul(tf.reshape(enc, [-1, h]), w_key),
                      [n, s, attention_size], name="keys")
    states = []
    for t, h_t in enumerate(decoder_outputs):
        with v1.name_scope(f"t{t}"):
            query = tf.expand_dims(tf.matmul(h_t, w_query), 1)  # [N, 1, A]
            scores = tf.reduce_sum(v * tf.tanh(keys + query), axis=2)  # [N, S]
            alpha = tf.expand_dims(tf.nn.softmax(scores), 2)  # [N, S, 1]
            context = tf.reduce_sum(alpha * enc, axis=1)  # [N, H]
            states.append(tf.tanh(tf.matmul(tf.concat([context, h_t], 1),
                                            w_out)))
    return states


def nmt(L: Layers, source: tf.Tensor, target: tf.Tensor, num_layers: int,
        hidden_size: int, vocab_size: int,
        embedding_size: Optional[int] = None,
        attention_size: Optional[int] = None):
    """Forward pass of an encoder-decoder LSTM with attention.

    Args:
      L: the layer factory.
      source: ``[N, S]`` int32 source word ids (S encoder steps).
      target: ``[N, T]`` int32 decoder input ids (T decoder steps; teacher
        forcing: the reference translation shifted right).
      num_layers: LSTM layers of the encoder and of the decoder.
      hidden_size, vocab_size: sizes (one vocabulary size for both sides).
      embedding_size: word-vector width; None: ``hidden_size``.
      attention_size: width of the attention's keys and queries; None:
        ``hidden_size``.
    Returns:
      ``[N, T, vocab_size]`` logits of the next target word at every step.
    """
    e = hidden_size if embedding_size is None else int(embedding_size)
    a = hidden_size if attention_size is None else int(attention_size)
    with v1.variable_scope("nmt"):
        with v1.variable_scope("encoder"):
            x = _embed(L, source, vocab_size, e, "embedding")
            final = []
            for k in range(num_layers):
                x, state = lstm_layer(L, x, hidden_size, f"lstm_{k}")
                final.append(state)
            encoder_outputs = x
        with v1.variable_scope("decoder"):
            y = _embed(L, target, vocab_size, e, "embedding")
            for k in range(num_layers):
                # Each decoder layer starts from its encoder layer's state.
                y, _ = lstm_layer(L, y, hidden_size, f"lstm_{k}",
                                  initial_state=final[k])
        with v1.variable_scope("attention"):
            states = _attention(L, encoder_outputs, y, a)
        return _softmax_logits(L, states, vocab_size)
