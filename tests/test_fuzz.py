"""Random values for every config key through ``train --check`` in-process, and odd flag values through the
real command: each ends in success or one clean error (exit 2, no traceback), never a crash or a hang."""

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from longboat.cli.main import main
from longboat.models.llm import DecoderConfig
from longboat.recipes.config import RunConfig
from longboat.tasks.pretrain import PretrainDataConfig
from tests.conftest import REPO, tiny_run_args

pytestmark = pytest.mark.slow

SCALARS = st.one_of(
    st.integers(-(10**15), 10**15),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["0", "-1", "1", "1e30", "-1e-30", ".nan", ".inf", "null", "true", "''", "[]", "{}", "[1, -2]",
                     "{a: 1}", "abc", "../..", "/", "a.b.c", "[[]]", "3e-4", "0x10", "🚀", "'1' * 3"]),
    st.text(max_size=12),
)


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a config class, nested models included."""
    out = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        out.append(key)
        for kind in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                out += keys(kind, f"{key}.")
    return out


ALL_KEYS = sorted(set(keys(RunConfig)) | {f"model.{k}" for k in keys(DecoderConfig)}
                  | {f"data.{k}" for k in keys(PretrainDataConfig)})


@pytest.fixture(scope="module")
def base_args(corpus, tmp_path_factory):
    return tiny_run_args(tmp_path_factory.mktemp("fuzz") / "run", corpus)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(ALL_KEYS), value=SCALARS)
def test_any_value_of_any_key_is_checked_cleanly(base_args, key, value, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a fuzzed path (cache_dir, run_dir) lands here, not in the repository
    raw = value if isinstance(value, str) else repr(value)
    code = main(["train", str(REPO / base_args[1]), *base_args[2:], "--check", f"{key}={raw}"])
    err = capsys.readouterr().err
    assert code in (0, 2), (key, raw, err)
    assert "Traceback" not in err
    if code == 2:
        # One line; or, when one value breaks several keys (a new nested section), a line per problem.
        assert err.startswith("error: ") and (err.count("\n") == 1 or " problems\n  " in err), (key, raw, err)


FLAGS = [
    ["generate", "{run}", "--top-p", "2"], ["generate", "{run}", "--top-p", "0"], ["generate", "{run}", "--top-k", "0"],
    ["generate", "{run}", "--temperature", "-1"], ["generate", "{run}", "--max-new-tokens", "-3"],
    ["generate", "{run}", "--max-new-tokens", "0"], ["generate", "{run}", "--num-samples", "0"],
    ["generate", "{run}", "--top-p", "nan"], ["generate", "{run}", "--seed", "x"],
    ["generate", "{tmp}/nothing"], ["generate", "{tmp}"], ["generate", "/dev/null"],
    ["export", "{run}", "--output", "{run}"], ["export", "{tmp}/nothing", "--output", "{tmp}/o"],
    ["export", "{run}/checkpoints", "--output", "{tmp}/o2"],
    ["convert", "hf-to-longboat", "{tmp}", "{tmp}/o3"], ["convert", "longboat-to-hf", "{run}", "{run}"],
    ["convert", "longboat-to-hf", "{run}", "{tmp}/o4", "--family", "gpt9"],
    ["convert", "longboat-to-hf", "{run}", "{tmp}/o5", "--max-shard-size", "lots"],
    ["convert", "sideways", "{run}", "{tmp}/o6"],
    ["train", "{tmp}/missing.yaml"], ["train", "{cfg}", "--nproc", "0"], ["train", "{cfg}", "--nproc", "-2"],
    ["train", "{cfg}", "not-an-override"], ["train", "{cfg}", "=1"], ["train", "{cfg}", "a..b=1"],
    ["data", "tokenize", "--input", "{tmp}/none.jsonl", "--tokenizer", "{tmp}", "--output-prefix", "{tmp}/x"],
    ["data", "train-tokenizer", "--input", "{tmp}/none.txt", "--vocab-size", "-5", "--output", "{tmp}/t"],
    ["data", "info", "{tmp}/nothing"], ["data", "info", "{tmp}"], ["data", "info", "/dev/null"], ["data", "info"],
    ["models", "--bogus"], ["nonsense"],
]


@pytest.fixture(scope="module")
def trained_run(corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("fuzz_run") / "run"
    subprocess.run([sys.executable, "-m", "longboat", *tiny_run_args(run, corpus, "train.steps=2")], cwd=REPO,
                   check=True, capture_output=True, timeout=300)
    return run


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: " ".join(f)[:60])
def test_odd_flags_fail_in_one_line(trained_run, tmp_path, flags):
    fill = {"run": str(trained_run), "tmp": str(tmp_path), "cfg": str(REPO / "configs/pretrain/quickstart.yaml")}
    args = [f.format(**fill) for f in flags]
    before = sorted(p.relative_to(trained_run) for p in trained_run.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "longboat", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.relative_to(trained_run) for p in trained_run.rglob("*")) == before  # nothing deleted or added
