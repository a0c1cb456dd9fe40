"""The fddps command: demo (README's main job), place -> simulate -> plot, bench, bad arguments."""

import subprocess
import sys

import pytest

from fddps.cli import main

tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def small_graph_file(tmp_path_factory):
    """A small two-branch graph saved as a binary GraphDef."""
    g = tf.Graph()
    with g.as_default():
        x = tf.random.stateless_normal([64, 64], seed=[1, 2], name="x")
        a = tf.matmul(x, x, name="a")
        b = tf.matmul(x, tf.transpose(x), name="b")
        tf.add(tf.nn.relu(a), tf.nn.relu(b), name="out")
    path = tmp_path_factory.mktemp("graphs") / "small.pb"
    path.write_bytes(g.as_graph_def().SerializeToString())
    return path


def test_demo_places_a_built_in_model_and_writes_its_outputs(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--model", "resnet50", "--batch-size", "2", "--gpus", "2",
                 "--algorithms", "fddps", "heft", "single", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fddps" in text and "heft" in text and "speedup_vs_single" in text
    for name in ("placed_graph.pb", "schedule.png", "trace.json", "algorithms.csv"):
        assert (out / name).stat().st_size > 0
    placed = tf.compat.v1.GraphDef()
    placed.ParseFromString((out / "placed_graph.pb").read_bytes())
    assert {n.device for n in placed.node} <= {"/device:GPU:0", "/device:GPU:1"}


@pytest.mark.reads_cpu
def test_place_then_simulate_then_plot(small_graph_file, tmp_path, capsys):
    placed = tmp_path / "placed.pbtxt"
    assert main(["place", str(small_graph_file), "--cpus", "2", "--out", str(placed),
                 "--trace", str(tmp_path / "t.json"), "--schedule-csv", str(tmp_path / "s.csv")]) == 0
    assert "predicted step time" in capsys.readouterr().out
    assert placed.read_text().count('device: "/device:CPU:') >= 5
    assert main(["simulate", str(placed)]) == 0
    assert "predicted step time" in capsys.readouterr().out
    png = tmp_path / "gantt.png"
    assert main(["plot", str(placed), "--out", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_bench_dispatches_to_the_experiment(capsys, tmp_path):
    pytest.importorskip("experiments.stg_quality")
    from experiments.stg_quality import stg_root

    try:
        stg_root()
    except FileNotFoundError:
        pytest.skip("no STG benchmark set")
    assert main(["bench", "stg", "--sizes", "50", "--procs", "2", "--limit", "3",
                 "--algorithms", "fddps", "--out", str(tmp_path / "stg.csv")]) == 0
    assert "mean_ratio" in capsys.readouterr().out


def test_bad_arguments_get_one_clear_line(small_graph_file, tmp_path, capsys):
    assert main(["place", "--model", "alexnet", "--cpus", "2"]) == 2
    assert "unknown model 'alexnet'; built-in models: vgg16" in capsys.readouterr().err
    assert main(["place", str(tmp_path / "missing.pb"), "--cpus", "2"]) == 2
    assert "no GraphDef file at" in capsys.readouterr().err
    assert main(["place", str(small_graph_file), "--devices", "/device:QPU:0"]) == 2
    assert "QPU" in capsys.readouterr().err
    assert main(["simulate", str(small_graph_file)]) == 2
    assert "no node has a device" in capsys.readouterr().err
    assert main(["demo", "--algorithms", "nope", "--batch-size", "2"]) == 2
    assert "unknown algorithm 'nope'" in capsys.readouterr().err
    assert main(["bench", "no-such-experiment"]) == 2
    assert "unknown experiment 'no-such-experiment'" in capsys.readouterr().err


def test_no_command_runs_the_demo_with_its_options(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["--model", "vgg16", "--batch-size", "2", "--gpus", "2", "--algorithms", "fddps",
                 "--out", str(out)]) == 0
    assert "fddps demo: vgg16" in capsys.readouterr().out
    assert (out / "placed_graph.pb").exists()


def test_help_runs_as_a_program():
    out = subprocess.run([sys.executable, "-m", "fddps", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "place" in out.stdout and "bench" in out.stdout


@pytest.mark.reads_cpu
def test_profile_writes_a_cost_model_that_place_accepts(tmp_path, capsys):
    out = tmp_path / "cm.json"
    assert main(["profile", "--model", "vgg16", "--batch-size", "2", "--steps", "2", "--warmup", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "coverage" in text and out.stat().st_size > 0
    assert main(["place", "--model", "vgg16", "--batch-size", "2", "--cpus", "2", "--cost-model",
                 str(out), "--out", str(tmp_path / "placed.pb")]) == 0
    assert "predicted step time" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["place", "--model", "resnet50", "--cpus", "0"], "argument --cpus: must be a positive integer, got '0'"),
    (["place", "--model", "resnet50", "--gpus", "-3"], "argument --gpus: must be a positive integer, got '-3'"),
    (["place", "--model", "resnet50", "--hosts", "0"], "argument --hosts: must be a positive integer"),
    (["place", "--model", "resnet50", "--batch-size", "-4"], "argument --batch-size: must be a positive"),
    (["place", "--model", "resnet50", "--memory", "-1"], "argument --memory: must be a positive, finite"),
    (["place", "--model", "resnet"], "argument --model: unknown model 'resnet' (did you mean 'resnet50'?)"),
    (["demo", "--gpus", "0"], "argument --gpus: must be a positive integer"),
    (["profile", "--model", "vgg16", "--warmup", "-1"], "argument --warmup: must be an integer >= 0"),
    (["palce"], "unknown command 'palce'; did you mean `fddps place`?"),
    (["bench", "strategie"], "unknown experiment 'strategie' (did you mean 'strategies'?)"),
])
def test_every_flag_is_checked_and_named(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_model_help_lists_the_models_and_bench_has_the_readme_experiments():
    import re
    from pathlib import Path

    import slim_models
    from fddps import cli

    assert cli.MODEL_NAMES == tuple(slim_models.ALL_MODELS)
    place = cli.build_parser()._subparsers._group_actions[0].choices["place"]
    assert all(name in place.format_help() for name in slim_models.ALL_MODELS)
    index = (Path(__file__).resolve().parents[1] / "docs" / "results" / "index.md").read_text()
    table = index[index.index("| name | what |"):].split("\n\n")[0]
    names = re.findall(r"^\| `(\w+)`", table, flags=re.M)
    assert len(names) >= 18
    modules = set(cli.BENCHMARKS.values())
    assert [n for n in names if f"experiments.{n}" not in modules] == []
    assert all(cli.bench_name(n) in cli.BENCHMARKS for n in names)


def test_tensorflow_start_up_lines_are_not_printed(small_graph_file, tmp_path):
    out = subprocess.run([sys.executable, "-m", "fddps", "place", str(small_graph_file),
                          "--cpus", "2", "--out", str(tmp_path / "p.pb")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    both = out.stdout + out.stderr
    assert both.count("oneDNN custom operations") <= 1
    assert both.count("absl::InitializeLog") <= 1


def test_simulate_of_a_placed_file_reproduces_place(tmp_path, capsys):
    """`fddps simulate` of `fddps place`'s output: the same cluster (idle devices and
    hosts included, recorded in the file), so the same prediction and peaks."""
    import re

    placed = tmp_path / "p.pb"
    assert main(["place", "--model", "vgg16", "--batch-size", "2", "--gpus", "2", "--hosts", "2",
                 "--out", str(placed)]) == 0
    text = capsys.readouterr().out
    tf_order = re.search(r"what the placed graph runs\) ([\d.]+) ms", text)
    predicted = float(tf_order.group(1) if tf_order else
                      re.search(r"predicted step time ([\d.]+) ms", text).group(1))
    assert "of the 4 devices given" in text
    assert main(["simulate", str(placed)]) == 0
    sim = capsys.readouterr().out
    got = float(re.search(r"predicted step time ([\d.]+) ms .* on \d of 4 devices", sim).group(1))
    assert got == pytest.approx(predicted, rel=0.01)
