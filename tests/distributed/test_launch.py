"""``longboat train`` under torchrun and ``--nproc``: a real 2-rank run, and mistakes that must fail fast."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from longboat.checkpoint.integrity import MANIFEST, checkpoint_problem
from longboat.recipes.generate import load_for_inference
from longboat.trainer.metrics import read_metrics
from tests.conftest import REPO, tiny_run_args
from tests.distributed.conftest import finish, free_ports, start, torchrun

pytestmark = pytest.mark.slow

# Mesh and head checks run before the data is read, so these runs need no corpus.
NO_DATA = ["data.tokenizer=missing", "data.paths=[missing]", "data.seq_len=16", "train.steps=1"]


def test_misconfigured_runs_fail_on_every_rank_without_hanging(tmp_path):
    (port,) = free_ports(1)
    launches = {
        # 3 ranks asked for, 2 started
        "mesh": torchrun(2, port, "-m", "longboat", "train", "configs/pretrain/quickstart.yaml",
                         f"run_dir={tmp_path / 'mesh'}", "parallel.dp_shard=3", *NO_DATA),
        # 2-way TP of a model with one key/value head
        "heads": [sys.executable, "-m", "longboat", "train", "--nproc", "2", "configs/pretrain/quickstart.yaml",
                  f"run_dir={tmp_path / 'heads'}", "parallel.tp=2", "model.n_kv_heads=1", *NO_DATA],
    }
    procs = {name: start(cmd, tmp_path / f"{name}.log") for name, cmd in launches.items()}
    logs = {name: finish(proc, tmp_path / f"{name}.log", timeout=120) for name, proc in procs.items()}
    assert procs["mesh"].returncode != 0 and procs["heads"].returncode != 0
    # Each rank checks before any communication; the first to fail ends the job, so torchrun may stop the other
    # before it prints: the message must come from a rank, and nothing may hang.
    mesh = "parallel: dp_replicate=1 × dp_shard=3 × tp=1 = 3 ranks, but the job has 2"
    heads = "parallel.tp=2 must divide the model's n_heads (4) and n_kv_heads (1)"
    assert any(f"[rank {r}] {mesh}" in logs["mesh"] for r in (0, 1))
    assert any(f"[rank {r}] {heads}" in logs["heads"] for r in (0, 1))


def test_a_rank_error_under_nproc_is_the_only_output(tmp_path):
    """torchrun's ChildFailedError traceback and failure table no longer follow the ranks' own error lines; the job
    exits with the failing rank's status (2: bad input)."""
    cmd = [sys.executable, "-m", "longboat", "train", "--nproc", "2", "configs/pretrain/quickstart.yaml",
           f"run_dir={tmp_path / 'run'}", "parallel.tp=2", "model.n_kv_heads=1", *NO_DATA]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-4000:]
    lines = proc.stderr.splitlines()
    assert lines and all(line.startswith("error: [rank ") for line in lines), proc.stderr[-4000:]
    assert "must divide the model's n_heads (4) and n_kv_heads (1)" in lines[0]


def test_bad_data_found_by_the_building_rank_is_the_jobs_one_error(tmp_path):
    """Rank 0 reads the SFT data while rank 1 waits for it: rank 0's one-line error ends the job, and rank 1 stops
    without a collective's traceback."""
    rows = (REPO / "tests/fixtures/sft/chat.jsonl").read_text().splitlines()[:2] + ['{"messages": 5}'] * 20
    (tmp_path / "bad.jsonl").write_text("\n".join(rows) + "\n")
    config = (REPO / "configs/sft/tiny.yaml").read_text().replace("tests/fixtures/sft/chat.jsonl",
                                                                  str(tmp_path / "bad.jsonl"))
    (tmp_path / "bad.yaml").write_text(config)
    cmd = [sys.executable, "-m", "longboat", "train", "--nproc", "2", str(tmp_path / "bad.yaml"),
           f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert proc.stderr.splitlines() == [line for line in proc.stderr.splitlines() if line.startswith("error: [rank 0]")]
    assert len(proc.stderr.splitlines()) == 1 and "20 of 22 rows are malformed" in proc.stderr, proc.stderr[-4000:]


def test_sigterm_to_the_nproc_launcher_stops_every_rank_with_a_checkpoint(corpus, tmp_path):
    """The launcher runs in the command's process: a SIGTERM to it reaches the ranks, which stop after the same step
    with one checkpoint, and the job exits 143 (128 + SIGTERM) without a launcher traceback."""
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    args = tiny_run_args(run_dir, corpus, "train.steps=5000", "train.num_workers=0", "checkpoint.export=false")
    proc = start([sys.executable, "-m", "longboat", "train", "--nproc", "2", *args[1:]], log)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, log, timeout=120)
    assert proc.returncode == 143, out[-4000:]
    assert "Traceback" not in out and "ChildFailedError" not in out
    step = int(re.search(r"SIGTERM: saving a checkpoint at step (\d+) and stopping", out).group(1))
    assert (run_dir / "checkpoints" / f"step_{step:08d}" / "COMPLETE").is_file()


def test_train_on_two_ranks_and_export_the_gathered_model(corpus, tmp_path):
    run_dir = tmp_path / "run"
    args = tiny_run_args(run_dir, corpus, "train.steps=4", "train.num_workers=0", "parallel.meta_init=true",
                         "parallel.activation_checkpointing=selective")
    log = tmp_path / "train.log"
    proc = start([sys.executable, "-m", "longboat", "train", "--nproc", "2", *args[1:]], log)
    out = finish(proc, log, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "mesh dp_replicate 1 × dp_shard 2 × tp 1 (fsdp)" in out
    assert out.count("exported to") == 1  # rank 0 speaks for the job
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3, 4]
    # Each rank checksums the files it writes; the manifest holds both ranks' files.
    manifest = json.loads((run_dir / "checkpoints" / "step_00000004" / MANIFEST).read_text())
    assert {"__0_0.distcp", "__1_0.distcp", "rng_rank1.pt"} <= set(manifest["checksums"]) == set(manifest["files"])
    assert checkpoint_problem(run_dir / "checkpoints" / "step_00000004") is None
    exported = load_for_inference(run_dir / "export").model.state_dict()
    checkpointed = load_for_inference(run_dir / "checkpoints" / "step_00000004").model.state_dict()
    assert exported.keys() == checkpointed.keys()
    for name, value in exported.items():
        torch.testing.assert_close(value, checkpointed[name], rtol=0, atol=0, msg=name)


def test_gpu_benchmark_dry_run_on_cpu(tmp_path):
    """bench/gpu_train.py --tiny: FSDP2 with bf16 parameters, meta init, selective AC and per-block compile,
    for a dense decoder and one with a mixture-of-experts layer."""
    (port,) = free_ports(1)
    log = tmp_path / "bench.log"
    # Safe path: scripts in bench/ must not shadow standard-library modules for each other. The graphs go through
    # inductor's decompositions and its min-cut partitioner (which applies selective AC's recompute policy) and then
    # run eagerly: building their C++ kernels took a minute and says nothing of the GPU's Triton ones
    # (tests/models/moe/test_moe_checkpoint_compile.py lowers MoE blocks with inductor).
    env = {"PYTHONSAFEPATH": "1", "TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:aot_eager_decomp_partition"}
    proc = start(torchrun(1, port, "bench/gpu_train.py", "--tiny"), log, env=env)
    out = finish(proc, log, timeout=300)
    assert proc.returncode == 0, out[-6000:]
    assert "tokens/s" in out and "MFU" in out and "compile True" in out
    assert "\ntiny (" in out and "\ntiny-moe (" in out and out.count("MFU") == 2


def test_pretraining_within_documents_on_two_ranks_matches_one_process(corpus, tmp_path):
    """``data.reset_attention_mask``: FSDP2 and tensor parallelism (the mask passes the attention's
    PrepareModuleInput untouched) follow the single-process loss curve over the same global batches."""
    common = ["train.steps=3", "train.num_workers=0", "train.eval_batches=0", "checkpoint.export=false",
              "data.reset_attention_mask=true", "data.reset_position_ids=true"]
    layouts = {  # 8 samples per step in each: micro-batches of 4, over two ranks or two accumulation steps
        "single": ([], ["train.grad_accum=2"]),
        "fsdp": (["--nproc", "2"], []),
        "tp": (["--nproc", "2"], ["parallel.tp=2", "train.grad_accum=2"]),
    }
    procs = {}
    for name, (launch, extra) in layouts.items():
        args = tiny_run_args(tmp_path / name, corpus, *common, *extra)
        procs[name] = start([sys.executable, "-m", "longboat", "train", *launch, *args[1:]], tmp_path / f"{name}.log")
    logs = {name: finish(proc, tmp_path / f"{name}.log", timeout=300) for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, logs[name][-6000:]
    assert "tp 2" in logs["tp"] and "dp_shard 2" in logs["fsdp"]
    curves = {name: [r["loss"] for r in read_metrics(tmp_path / name)] for name in layouts}
    assert len(curves["single"]) == 3
    for name in ("fsdp", "tp"):
        torch.testing.assert_close(curves[name], curves["single"], atol=1e-5, rtol=1e-5, msg=name)


def test_param_groups_freeze_and_scale_under_fsdp(corpus, tmp_path):
    """``train.param_groups`` name the plain model's parameters under FSDP2 too: the frozen layer leaves the run
    bitwise as it started (as in a run that trains only the final norm), and the loss follows one process's."""
    from safetensors.torch import load_file

    common = ["train.steps=3", "train.num_workers=0", "train.eval_batches=0"]
    rules = '[{match: "layers.0.*", lr_scale: 0}, {match: "layers.1.*", lr_scale: 0.5}]'
    only_norm = '[{match: "norm.weight", lr_scale: 1}, {match: "*", lr_scale: 0}]'
    runs = {"fsdp": (["--nproc", "2"], rules), "single": ([], rules), "start": (["--nproc", "2"], only_norm)}
    procs = {}
    for name, (launch, groups) in runs.items():
        extra = [] if launch else ["train.grad_accum=2"]  # 8 samples per step in each
        args = tiny_run_args(tmp_path / name, corpus, *common, *extra, f"train.param_groups={groups}")
        procs[name] = start([sys.executable, "-m", "longboat", "train", *launch, *args[1:]], tmp_path / f"{name}.log")
    logs = {name: finish(proc, tmp_path / f"{name}.log", timeout=300) for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, logs[name][-6000:]
    weights = {name: load_file(tmp_path / name / "export" / "model.safetensors") for name in runs}
    for key, start_value in weights["start"].items():
        same = torch.equal(weights["fsdp"][key], start_value)
        assert same == key.startswith("layers.0."), key
    curves = {name: [r["loss"] for r in read_metrics(tmp_path / name)] for name in ("fsdp", "single")}
    torch.testing.assert_close(curves["fsdp"], curves["single"], atol=1e-5, rtol=1e-5)
