"""``export`` and ``convert`` never delete what they should not: sources, runs, checkpoints, a user's files.

Each case goes through the command line and checks that every file that was there is still there, byte for
byte. ``longboat.utils.outputs`` is also tested directly: the swap, a crash or a stop signal mid-write, links,
files and files that belong together.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from longboat.checkpoint.export import save_export
from longboat.cli.main import main
from longboat.utils.interrupt import Interrupted
from longboat.utils.outputs import (OutputError, OutputPlaceError, check_file_output, check_output, replace_file,
                                    staged_file, staged_files, staged_output)
from tests.conftest import run_longboat, tiny_run_args


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a digest of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_refused(code: int, capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for f in fragments:
        assert f in err, f"{f!r} not in:\n{err}"
    return err


def no_leftovers(parent: Path) -> None:
    """No staging or moved-aside sibling remains."""
    assert not [p.name for p in parent.iterdir() if p.name.endswith((".partial", ".old"))]


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> Path:
    """A trained tiny run: two checkpoints and its export."""
    run = tmp_path_factory.mktemp("outputs") / "run"
    run_longboat(*tiny_run_args(run, corpus, "train.steps=4", "checkpoint.every=2"), check=True)
    assert (run / "export").is_dir() and len(list((run / "checkpoints").iterdir())) == 2
    return run


# ---- through the command line -------------------------------------------------------------------------


@pytest.mark.slow
def test_export_onto_its_own_run_is_refused(run):
    before = snapshot(run)
    for extra in ([], ["--overwrite"]):
        proc = run_longboat("export", str(run), "--output", str(run), *extra)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"error: {run}: is the source this command reads" in proc.stderr
    assert snapshot(run) == before


@pytest.mark.slow
def test_convert_onto_its_own_export_is_refused(run, tmp_path):
    export = tmp_path / "e"
    assert main(["export", str(run), "--output", str(export)]) == 0
    before = snapshot(export)
    for extra in ([], ["--overwrite"]):
        proc = run_longboat("convert", "longboat-to-hf", str(export), str(export), *extra)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "is the source this command reads" in proc.stderr
    assert snapshot(export) == before
    no_leftovers(tmp_path)


def test_a_users_directory_is_kept_unless_overwrite(run, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert_refused(main(["export", str(run), "--output", str(mine)]), capsys,
                   f"{mine} already exists and is not empty", "--overwrite")
    assert_refused(main(["convert", "longboat-to-hf", str(run), str(mine)]), capsys, "--overwrite")
    assert (mine / "notes.txt").read_text() == "keep me"

    assert main(["export", str(run), "--output", str(mine), "--overwrite"]) == 0
    assert (mine / "longboat_config.json").is_file() and not (mine / "notes.txt").exists()
    assert main(["convert", "longboat-to-hf", str(mine), str(tmp_path / "hf")]) == 0
    assert main(["convert", "longboat-to-hf", str(mine), str(tmp_path / "hf"), "--overwrite"]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()
    no_leftovers(tmp_path)


def test_runs_and_checkpoints_are_never_replaced(run, tmp_path, capsys):
    step = sorted((run / "checkpoints").iterdir())[0]
    export = tmp_path / "e"
    assert main(["export", str(run), "--output", str(export)]) == 0
    for inner in (run / "checkpoints" / "other", step / "extra"):  # a user's directories inside
        inner.mkdir(exist_ok=True)
        (inner / "f").write_text("x")
    before = snapshot(run)
    cases = [  # (command, what the error says)
        (["export", str(step), "--output", str(run / "checkpoints")], f"holds {step}, which this command reads"),
        (["export", str(step), "--output", str(run.parent)], "holds"),
        (["export", str(export), "--output", str(step)], "is a checkpoint (has COMPLETE)"),
        (["convert", "longboat-to-hf", str(export), str(run)], "is a run directory"),
        (["export", str(step), "--output", str(run / "checkpoints" / "other")], "is inside the run directory"),
        (["convert", "longboat-to-hf", str(export), str(step / "extra")], "is inside the checkpoint"),
    ]
    for argv, message in cases:
        assert_refused(main([*argv, "--overwrite"]), capsys, message, "refusing to replace it")
    assert snapshot(run) == before


def test_a_runs_own_export_directories_may_be_rewritten(run, capsys):
    assert_refused(main(["export", str(run), "--output", str(run / "export")]), capsys, "--overwrite")
    checkpoints = snapshot(run / "checkpoints")
    assert main(["export", str(run), "--output", str(run / "export"), "--overwrite"]) == 0
    assert main(["convert", "longboat-to-hf", str(run), str(run / "hf")]) == 0
    assert main(["convert", "longboat-to-hf", str(run), str(run / "hf"), "--overwrite"]) == 0
    capsys.readouterr()
    # The run reads its export here, so the export itself may not be the output.
    assert_refused(main(["convert", "longboat-to-hf", str(run), str(run / "export"), "--overwrite"]), capsys,
                   "is the source this command reads")
    assert snapshot(run / "checkpoints") == checkpoints and (run / "config.yaml").is_file()
    no_leftovers(run)


def test_convert_never_replaces_the_hf_directory_it_reads(run, tmp_path, capsys):
    hf = tmp_path / "outer" / "hf"
    assert main(["convert", "longboat-to-hf", str(run), str(hf)]) == 0
    before = snapshot(tmp_path / "outer")
    assert_refused(main(["convert", "hf-to-longboat", str(hf), str(hf), "--overwrite"]), capsys, "is the source")
    assert_refused(main(["convert", "hf-to-longboat", str(hf), str(tmp_path / "outer"), "--overwrite"]), capsys,
                   "holds")
    assert snapshot(tmp_path / "outer") == before
    assert main(["convert", "hf-to-longboat", str(hf), str(hf / "ours")]) == 0  # a new directory inside: harmless


# ---- longboat.utils.outputs ------------------------------------------------------------------------------


def test_a_crash_while_writing_leaves_the_old_output(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(RuntimeError), staged_output(target, overwrite=True) as stage:
        (stage / "new").write_text("new")
        raise RuntimeError("killed mid-write")
    assert snapshot(target) == {"old": hashlib.sha256(b"old").hexdigest()}
    no_leftovers(tmp_path)
    with staged_output(target, overwrite=True) as stage:
        (stage / "new").write_text("new")
    assert sorted(os.listdir(target)) == ["new"]
    no_leftovers(tmp_path)


def test_missing_or_empty_targets_are_written_with_the_usual_permissions(tmp_path):
    (tmp_path / "empty").mkdir()
    for name in ("empty", "deep/new"):
        with staged_output(tmp_path / name) as stage:
            (stage / "f").write_text("x")
        assert (tmp_path / name / "f").read_text() == "x"
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "deep" / "new").stat().st_mode & 0o777 == 0o777 & ~umask


def test_files_and_links_as_targets(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "data").write_text("kept")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(OutputError, match="already exists"):
        check_output(link)
    with staged_output(link, overwrite=True) as stage:
        (stage / "f").write_text("x")
    assert not link.is_symlink() and (link / "f").is_file() and (real / "data").read_text() == "kept"
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(OutputError, match="already exists"):
        check_output(file)
    with pytest.raises(OutputError, match="is the source"):
        check_output(link, overwrite=True, sources=[link / "."])


def test_training_rewrites_only_a_runs_own_exports_by_default(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    weights = {"w": __import__("torch").zeros(2)}
    for _ in range(2):  # training writes, then a later run rewrites, with no flag
        save_export(run / "export", weights, "decoder", {})
    assert json.loads((run / "export" / "longboat_config.json").read_text())["arch"] == "decoder"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "f").write_text("x")
    with pytest.raises(OutputError, match="already exists"):
        save_export(tmp_path / "mine", weights, "decoder", {})
    with pytest.raises(OutputError, match="is the source"):
        save_export(run / "export", weights, "decoder", {}, sources=[run / "export"])
    assert (tmp_path / "mine" / "f").read_text() == "x"
    no_leftovers(run)


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("old")
    with pytest.raises(OutputError, match="results.json already exists; pass --overwrite"):
        with staged_file(target):
            pytest.fail("a refused output is not staged")
    for stop in (KeyboardInterrupt, RuntimeError):
        with pytest.raises(stop), staged_file(target, overwrite=True) as stage:
            assert stage.parent == tmp_path and stage.name.startswith(".results.json.") and stage.is_file()
            stage.write_text("half")
            raise stop
        assert target.read_text() == "old" and os.listdir(tmp_path) == ["results.json"]
    with staged_file(target, overwrite=True) as stage:
        stage.write_text("new")
    assert target.read_text() == "new" and os.listdir(tmp_path) == ["results.json"]
    with pytest.raises(OutputError, match="is an input of this command"):
        check_file_output(target, overwrite=True, sources=[tmp_path / "." / "results.json"])
    with pytest.raises(OutputError, match="is a directory; expected the path of a file"):
        check_file_output(tmp_path, overwrite=True)


def test_sigterm_while_a_file_is_written_leaves_the_old_one(tmp_path):
    """SIGTERM, which would end the process with its hidden sibling left behind, is raised like Ctrl-C."""
    target = tmp_path / "out.txt"
    target.write_text("old")
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a command; a test runner may have its own
    try:
        with pytest.raises(Interrupted) as stopped, staged_file(target, overwrite=True) as stage:
            stage.write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.value.signum == signal.SIGTERM and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_a_process_forked_while_a_file_is_written_dies_of_sigterm(tmp_path):
    """A process pool forked while an output is staged (tokenize's workers) is ended with SIGTERM: its workers
    must die of it as before, not raise into their parent's cleanup."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with staged_file(tmp_path / "out.txt"):
            ready, started = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.write(started, b"x")
                    time.sleep(30)
                finally:
                    os._exit(0)
            os.read(ready, 1)
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_files_that_belong_together_are_swapped_in_together(tmp_path):
    """NAME.bin + NAME.idx: refused when either exists, and both are replaced only when both are complete."""
    bin_, idx = tmp_path / "tokens.bin", tmp_path / "tokens.idx"
    idx.write_text("old idx")
    with pytest.raises(OutputError, match="tokens.idx already exists"):
        with staged_files([bin_, idx]):
            pytest.fail("a refused output is not staged")
    with pytest.raises(KeyboardInterrupt), staged_files([bin_, idx], overwrite=True) as (b, i):
        b.write_text("new bin")
        raise KeyboardInterrupt  # before the index is complete
    assert os.listdir(tmp_path) == ["tokens.idx"] and idx.read_text() == "old idx"
    with staged_files([bin_, idx], overwrite=True) as (b, i):
        b.write_text("new bin")
        i.write_text("new idx")
        assert not bin_.exists()
    assert sorted(os.listdir(tmp_path)) == ["tokens.bin", "tokens.idx"] and idx.read_text() == "new idx"


def test_a_place_the_os_refuses_is_a_world_error(tmp_path):
    (tmp_path / "file").write_text("mine")
    for stage in (staged_file(tmp_path / "file" / "out.json"), staged_output(tmp_path / "file" / "sub" / "out")):
        with pytest.raises(OutputPlaceError, match=rf"cannot write here \({tmp_path / 'file'} is a file"):
            with stage:
                pytest.fail("nothing is staged where the OS refuses")
    assert OutputPlaceError.exit_code == 1 and os.listdir(tmp_path) == ["file"]


def test_a_file_the_command_owns_is_replaced_whole(tmp_path):
    run_json = tmp_path / "run.json"
    replace_file(run_json, '{"seeds": [0]}\n')
    with pytest.raises(UnicodeEncodeError):
        replace_file(run_json, '{"task": "\ud800"}\n')  # fails half-way through writing
    assert run_json.read_text() == '{"seeds": [0]}\n' and os.listdir(tmp_path) == ["run.json"]


def test_a_cache_directory_is_published_whole_or_not_at_all(tmp_path):
    from longboat.utils.outputs import cache_directory

    final = tmp_path / "cache-abc"
    with pytest.raises(RuntimeError), cache_directory(final) as tmp:
        (tmp / "half.npy").write_bytes(b"x")
        raise RuntimeError("interrupted while building")
    assert list(tmp_path.iterdir()) == []  # neither the cache nor its temporary directory
    with cache_directory(final) as tmp:
        (tmp / "a.npy").write_bytes(b"first")
    with cache_directory(final) as tmp:  # another builder finishing second: the published copy stays
        (tmp / "a.npy").write_bytes(b"second")
    assert [p.name for p in tmp_path.iterdir()] == ["cache-abc"] and (final / "a.npy").read_bytes() == b"first"
