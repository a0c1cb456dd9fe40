"""Smoke test of experiments.transfer_overlap: small transfers alone vs at once on 2 workers."""

import pytest

pytest.importorskip("tensorflow")


def test_the_graphs_send_what_each_variant_names():
    from experiments import transfer_overlap as to

    devices = ["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"]
    g, fetch, seed = to.build(devices, "chain", 6, ops=3, size=4, nbytes=64)
    adds = [op for op in g.get_operations() if op.type == "AddV2" and op.inputs[0].shape == (16,)]
    assert len(adds) == 6  # one hop per transfer, alternating workers, each reading the last
    assert ["/task:1/" in op.device for op in adds] == [True, False] * 3
    assert all(a.inputs[0].op is b for a, b in zip(adds[1:], adds))
    g, _, _ = to.build(devices, "burst", 6, ops=3, size=4, nbytes=64)
    fills = [op for op in g.get_operations() if op.type == "Fill" and "seed" not in op.name
             and op.outputs[0].shape == (16,)]
    assert len(fills) == 6  # 3 each way, all independent
    g, _, _ = to.build(devices, "none", 6, ops=3, size=4)
    assert sum(op.type == "MatMul" for op in g.get_operations()) == 6
    assert seed == "seed:0"


@pytest.mark.slow
def test_transfer_overlap_experiment_smoke(tmp_path, capsys):
    from experiments import transfer_overlap as to

    out = tmp_path / "overlap.csv"
    df = to.main(["--counts", "8", "--ops", "40", "--steps", "2", "--warmup", "1",
                  "--out", str(out)])
    assert "variants alternated" in capsys.readouterr().out
    assert list(df.variant) == list(to.VARIANTS) and (df.median_ms > 0).all()
    per = df.set_index("variant").added_us_per_transfer
    assert per[["chain", "burst"]].notna().all() and per[["none", "chain only"]].isna().all()
    assert out.stat().st_size > 0
