"""README's code blocks run as written (so the quick starts never rot), and so do the guide's.

Every fenced block of README.md is either ``python`` (executed here, in a fresh
namespace, from a temporary folder) or ``bash``: each of its command lines is
one that ``.ci/run`` runs verbatim (the test and docs commands), or a chain of
``python -m pip install -e <spec>`` (the extras named exist in setup.cfg) and
``python -m fddps [ARGS]`` (ARGS parse; tests/test_cli.py runs the demo itself).
A block in any other language, or none, fails: nothing in the README goes
unchecked. The ``python`` blocks of the user guide (docs/guide/*.md) are
executed the same way.
"""

import configparser
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)


def _blocks(path):
    return [(lang.strip(), body) for lang, body in FENCE.findall(path.read_text())]


README_BLOCKS = _blocks(README)
PYTHON = [body for lang, body in README_BLOCKS if lang == "python"]
SHELL = [body for lang, body in README_BLOCKS if lang == "bash"]
GUIDE = [(path.name, body) for path in sorted((ROOT / "docs" / "guide").glob("*.md"))
         for lang, body in _blocks(path) if lang == "python"]


def test_readme_is_short_and_every_block_is_checked():
    assert len(README.read_text().splitlines()) <= 250
    assert {lang for lang, _ in README_BLOCKS} <= {"python", "bash"}, \
        "a README block in another language would not be run by this test"
    assert len(PYTHON) >= 2 and SHELL


def _run_python(source, name, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # examples may write files (trace.json)
    exec(compile(source, name, "exec"), {})


@pytest.mark.reads_cpu("avx2-2.0GHz")
@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_readme_example_runs(index, tmp_path, monkeypatch):
    _run_python(PYTHON[index], f"README.md example {index + 1}", tmp_path, monkeypatch)


@pytest.mark.parametrize("index", range(len(GUIDE)), ids=[f"{n}-{i}" for i, (n, _) in enumerate(GUIDE)])
def test_guide_example_runs(index, tmp_path, monkeypatch):
    name, body = GUIDE[index]
    _run_python(body, f"docs/guide/{name} example", tmp_path, monkeypatch)


def _extras():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options.extras_require"])


def _check_command(command):
    from fddps.cli import build_parser

    args = shlex.split(command)
    if args[:5] == ["python", "-m", "pip", "install", "-e"] and len(args) == 6:
        match = re.fullmatch(r"\.(?:\[([\w,]+)\])?", args[5])
        assert match, f"pip installs something other than this checkout: {command!r}"
        missing = set((match.group(1) or "").split(",")) - {""} - _extras()
        assert not missing, f"{command!r} names extras setup.cfg lacks: {missing}"
    elif args[:3] == ["python", "-m", "fddps"]:
        build_parser().parse_args(args[3:])  # exits (SystemExit) on arguments it does not take
    else:
        raise AssertionError(f"README runs {command!r}, which neither .ci/run runs nor this test checks")


@pytest.mark.parametrize("index", range(len(SHELL)))
def test_readme_shell_commands_are_run_by_ci_or_checked(index):
    ci = (ROOT / ".ci" / "run").read_text()
    for line in SHELL[index].strip().splitlines():
        if line.startswith("#") or line in ci:
            continue
        for command in line.split("&&"):
            _check_command(command.strip())
