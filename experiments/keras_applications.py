"""keras.applications models placed by fddps, trained one step in float64 against Keras.

Each model (ResNet50, MobileNetV2, DenseNet121, EfficientNetB0, MobileNet
with its Dropout, and a small transformer block with LayerNormalization and
self-attention) is built in float64 (``keras.config.set_floatx("float64")``)
at 32x32 (the attention block: 8 tokens of 16), batch 4, SGD with momentum;
it is placed on 2 logical CPU devices of this process three ways that spread
it: HEFT, FD-DPS on a cluster where spreading pays (each device with cores of
its own, a 1 GFLOP/s CPU preset) and the data-parallel strategy. One placed
``train_step`` is compared with ``train_on_batch`` on an identical model:
``loss_diff`` and ``max_weight_diff`` (over every weight, non-trainable ones
included) must be at float64 rounding (< 1e-9), and ``moved_ops`` (ops the
runtime ran elsewhere than placed) 0. In float32 the same comparison is
dominated by rounding amplified by batch norm (see :mod:`fddps.tf.float64`).

SGD, not Adam: the convolutions of these models have a bias before a batch
norm, whose gradient is 0 up to rounding; Adam divides it by its own size and
turns any rounding, float64's too, into a full step.

Run: ``python -m experiments.keras_applications [--models resnet50 ...]``;
writes ``experiments/results/keras_applications.csv`` and ``.md``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from .common import RESULTS, ensure_parent, tf_quiet

#: Placements of the family: label -> (place() keywords, whether the cluster gives
#: each device cores of its own).
# enforce_order=False: the step as the algorithm spreads it. With the order guard
# ("auto"), a spread over logical CPUs predicted less than 10% faster than one
# device goes back to one device (fddps.tf.schedule_place.SPREAD_MARGIN), and these
# placements are here to be checked spread.
PLACEMENTS = {
    "heft": ({"algorithm": "heft", "enforce_order": False}, False),
    "fddps": ({"algorithm": "fddps", "enforce_order": False}, True),
    "data_parallel": ({"strategy": "data_parallel"}, False),
}

BATCH = 4


def _attention(keras):
    """A transformer block: self-attention (written with keras.ops), LayerNormalization, MLP."""
    ops = keras.ops
    inp = keras.Input((8, 16))
    q, k, v = (keras.layers.Dense(16, name=n)(inp) for n in ("query", "key", "value"))
    att = ops.softmax(ops.matmul(q, ops.transpose(k, (0, 2, 1))) / 4.0, axis=-1)
    h = keras.layers.Dropout(0.1)(ops.matmul(att, v))
    h = keras.layers.LayerNormalization()(inp + keras.layers.Dense(16)(h))
    f = keras.layers.Dense(32, activation="relu")(h)
    h = keras.layers.LayerNormalization()(h + keras.layers.Dense(16)(f))
    out = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(inp, out, name="attention")


def builders(keras) -> dict:
    """Model name -> function building it (float64 when floatx is)."""
    A = keras.applications
    common = dict(weights=None, input_shape=(32, 32, 3), classes=10, classifier_activation=None)
    return {
        "ResNet50": lambda: A.ResNet50(**common),
        "MobileNetV2": lambda: A.MobileNetV2(alpha=0.35, **common),
        "DenseNet121": lambda: A.DenseNet121(**common),
        "EfficientNetB0": lambda: A.EfficientNetB0(**common),
        "MobileNet (Dropout)": lambda: A.MobileNet(alpha=0.25, **common),
        "attention (LayerNormalization)": lambda: _attention(keras),
    }


class Case:
    """One model in float64: its builder, an example batch, and Keras's own step's result."""

    def __init__(self, name, devices, cost_model):
        import keras

        self.name, self.devices, self.cost_model = name, devices, cost_model
        self._build = builders(keras)[name]
        model = self.make()
        rng = np.random.RandomState(0)
        self.x = rng.randn(BATCH, *model.input_shape[1:])
        self.y = rng.randint(0, 10, BATCH).astype(np.int32)
        ref = self.make()
        ref.compile(optimizer=self.optimizer(), loss=self.loss())
        self.want_loss = float(ref.train_on_batch(self.x, self.y, return_dict=True)["loss"])
        self.want_weights = [w.numpy() for w in ref.weights]

    def make(self):
        import keras

        keras.utils.set_random_seed(0)  # same weights and dropout seeds each time
        return self._build()

    @staticmethod
    def loss():
        import keras

        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @staticmethod
    def optimizer():
        import keras

        return keras.optimizers.SGD(0.01, momentum=0.9)

    def place(self, placement):
        """A fresh identical model placed the given way: (StepPlacement, seconds)."""
        import fddps
        from fddps.tf import make_cluster

        keywords, own_cores = PLACEMENTS[placement]
        devices = (make_cluster(self.devices, self.cost_model, share_cores=False)
                   if own_cores else self.devices)
        model = self.make()
        t0 = time.perf_counter()
        # verify=False: each placement is checked as spread; on logical CPUs sharing this
        # machine's cores verification could return the one-device step instead.
        p = fddps.place(model, devices, loss=self.loss(), optimizer=self.optimizer(),
                        batch=(self.x, self.y), cost_model=self.cost_model, verify=False,
                        **keywords)
        return p, time.perf_counter() - t0

    def compare(self, p) -> dict:
        """Run one placed step; its differences from Keras's."""
        got = float(p.train_step(self.x, self.y)["loss"])
        weights = [w.numpy() for w in p.model.weights]
        assert len(weights) == len(self.want_weights)
        return {
            "loss_diff": abs(got - self.want_loss),
            "max_weight_diff": max(float(np.abs(a - b).max())
                                   for a, b in zip(weights, self.want_weights)),
            "moved_ops": len(p.moved_ops()),
            "devices_used": len(set(p.ran_on.values())),
            "ops_with_their_variables": len(p.info.get("ops_with_their_variables") or ()),
        }


def test_cost_model():
    """The fixed CPU preset of the tests (1 GFLOP/s), so placements do not depend on the machine."""
    from costmodel import DevicePreset, default_cost_model

    return default_cost_model(cpu=DevicePreset(
        "test-cpu", "CPU", peak_flops=1e9, memory_bandwidth=10e9, memory=16 * 2**30,
        overhead=5e-6))


def measure(models=None, placements=None, on_row=None) -> pd.DataFrame:
    """One row per model x placement (see the module docstring); ``on_row(df)`` is
    called with the rows so far after each (to save partial results). A placement
    that raises gets a row with its ``error``."""
    tf_quiet()
    import warnings

    from fddps.tf import local_cpu_devices

    devices = local_cpu_devices(2)
    import keras

    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")  # the global policy may be fixed at float32 already
    cost_model = test_cost_model()
    rows = []
    for name in models or list(builders(keras)):
        case = Case(name, devices, cost_model)
        for placement in placements or list(PLACEMENTS):
            row = {"model": name, "placement": placement}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    p, seconds = case.place(placement)
                row.update(nodes=p.info["nodes"], place_seconds=round(seconds, 1))
                row.update(case.compare(p))
            except Exception as err:  # noqa: BLE001 - recorded in the table, not hidden
                row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
            rows.append(row)
            print(row, flush=True)
            if on_row is not None:
                on_row(pd.DataFrame(rows))
    return pd.DataFrame(rows)


def _markdown_table(df) -> str:
    """A markdown table of ``df`` (floats as %.2e, NaN blank); no tabulate needed."""
    def cell(v):
        if isinstance(v, float):
            return "" if np.isnan(v) else f"{v:.2e}" if v and abs(v) < 1e-3 else f"{v:g}"
        return str(v)

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def write_markdown(df, path, command):
    cpu = platform.processor() or platform.machine()
    lines = [
        "# keras.applications models placed, one step in float64 against Keras",
        "",
        f"Command: `{command}`; {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {cpu} "
        f"({platform.node()}), 2 logical CPU devices.",
        "",
        "What it measures: " + " ".join(__doc__.split("\n\n")[1].split()),
        "",
        _markdown_table(df),
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", help="model names (default: all)")
    ap.add_argument("--placements", nargs="+", choices=list(PLACEMENTS))
    ap.add_argument("--out", default=str(RESULTS / "keras_applications.csv"))
    args = ap.parse_args(argv)
    out = ensure_parent(args.out)
    command = "python -m experiments.keras_applications" + "".join(
        f" {a!r}" if " " in a else f" {a}" for a in (argv if argv is not None else sys.argv[1:]))

    def save(df):
        df.to_csv(out, index=False)
        write_markdown(df, out.with_suffix(".md"), command)

    df = measure(args.models, args.placements, on_row=save)
    with pd.option_context("display.width", 160):
        print(df.to_string(index=False))
    save(df)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
