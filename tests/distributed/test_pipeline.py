"""Pipeline parallelism: the stage split and its config errors in one process, and real gloo ranks trained with
the real Trainer against one process (losses, gradient norms, final weights) for GPipe, 1F1B, interleaved 1F1B,
pp × FSDP, and checkpoints moved between pp 2 and one process."""

import pytest
import torch
from pydantic import ValidationError

from longboat.cli.main import main
from longboat.config.base import ConfigError
from longboat.distributed import ParallelConfig, resolve_dims
from longboat.distributed.pipeline import StageLayers, _keep, check_microbatches, stage_layer_counts
from longboat.models import build_model, get_model
from tests.conftest import REPO
from tests.distributed.conftest import WORKER, finish, free_ports, start, torchrun
from tests.distributed.test_parallelize import _assert_same_run
from tests.distributed.train_worker import MODELS, SAVE_AT, run_case

TWO_RANKS = ["pp_gpipe", "pp_1f1b", "pp_interleaved", "pp_from_single"]
FOUR_RANKS = ["pp_fsdp", "pp_interleaved_fsdp"]


def test_even_split_gives_earlier_stages_the_remainder():
    assert stage_layer_counts(8, 4) == [2, 2, 2, 2]
    assert stage_layer_counts(7, 3) == [3, 2, 2]
    assert stage_layer_counts(5, 2, [1, 4]) == [1, 4]
    with pytest.raises(ConfigError, match=r"parallel.pp_layers=\[2, 2\] sums to 4 layers, but the model has 5"):
        stage_layer_counts(5, 2, [2, 2])
    with pytest.raises(ConfigError, match="4 pipeline stages .* the model has 2"):
        stage_layer_counts(2, 4)


@pytest.mark.parametrize("fields,match", [
    ({"pp": 2, "pp_schedule": "interleaved_1f1b"}, "interleaved_1f1b needs parallel.pp_virtual_stages >= 2"),
    ({"pp": 2, "pp_virtual_stages": 2}, "pp_virtual_stages=2 needs parallel.pp_schedule=interleaved_1f1b"),
    ({"pp": 2, "pp_layers": [1, 1, 1]}, r"pp_layers must give 2 positive layer counts"),
    ({"pp": 2, "data_parallel": "ddp"}, "use parallel.data_parallel=fsdp"),
    ({"pp": 2, "tp": 2}, "parallel.pp > 1 cannot be combined with parallel.tp > 1"),
])
def test_config_names_the_pipeline_key(fields, match):
    with pytest.raises(ValidationError, match=match):
        ParallelConfig(**fields)


def test_schedules_check_the_micro_batch_count():
    check_microbatches(ParallelConfig(pp=4, pp_schedule="gpipe"), 1)
    with pytest.raises(ConfigError, match=r"train.grad_accum=3: .*1f1b needs at least one micro-batch per stage \(4\)"):
        check_microbatches(ParallelConfig(pp=4), 3)
    interleaved = ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_virtual_stages=2)
    with pytest.raises(ConfigError, match=r"train.grad_accum=3: .*needs a multiple of parallel.pp=2"):
        check_microbatches(interleaved, 3)


def test_pp_is_the_outermost_axis_of_the_world():
    dims = resolve_dims(ParallelConfig(pp=2, dp_shard=-1), 8)
    assert (dims.pp, dims.dp_shard, dims.world_size) == (2, 4, 8)
    with pytest.raises(ConfigError, match=r"6 ranks cannot be split as pp=4 × dp_replicate=1 × tp=1"):
        resolve_dims(ParallelConfig(pp=4), 6)


def test_decoder_split_refuses_tied_embeddings():
    spec = get_model("decoder")
    with pytest.raises(ConfigError, match="parallel.pp > 1 needs model.tie_embeddings=false"):
        spec.pipeline_split(build_model("decoder", MODELS["tied"]).cfg)


def test_stages_keep_full_model_names_and_chain_to_the_full_forward():
    """A middle stage takes and gives hidden states; the stages in a row compute the full model's logits."""
    torch.manual_seed(0)
    full = build_model("decoder", MODELS["untied_4"])
    split = get_model("decoder").pipeline_split(full.cfg)
    names = full.state_dict().keys()
    stages = []
    for layers, first, last in [((0,), True, False), ((1, 2), False, False), ((3,), False, True)]:
        stage = build_model("decoder", MODELS["untied_4"])
        stage.load_state_dict(full.state_dict())
        _keep(stage, split, {str(i): stage.layers[i] for i in layers}, first, last)
        assert isinstance(stage.layers, StageLayers)
        assert set(stage.state_dict()) <= set(names)
        stages.append(stage)
    assert set().union(*(s.state_dict().keys() for s in stages)) == set(names)
    assert {n.split(".")[1] for n in stages[1].state_dict()} == {"1", "2"}
    tokens = torch.randint(0, MODELS["untied_4"]["vocab_size"], (2, 9))
    h = tokens
    for stage in stages:
        h = stage(h)
    torch.testing.assert_close(h, full(tokens))


# The pipeline checks run before the data is read, so these need no corpus.
NO_DATA = ["data.tokenizer=missing", "data.paths=[missing]", "data.seq_len=16", "train.steps=1", "model.n_layers=2",
           "model.tie_embeddings=false", "parallel.pp=2", "train.grad_accum=2", "train.eval_batches=2"]


@pytest.mark.parametrize("override,message", [
    ("model.tie_embeddings=true", "parallel.pp > 1 needs model.tie_embeddings=false"),
    ("parallel.pp_layers=[2,1]", "parallel.pp_layers=[2, 1] sums to 3 layers, but the model has 2"),
    ("train.grad_accum=1", "train.grad_accum=1: parallel.pp_schedule=1f1b needs at least one micro-batch per stage"),
    ("train.eval_batches=3", "train.eval_batches=3 must be a multiple of train.grad_accum=2"),
])
def test_train_check_names_the_pipeline_mistake(capsys, override, message):
    code = main(["train", str(REPO / "configs/pretrain/quickstart.yaml"), *NO_DATA, override, "--check", "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


# ---- real ranks --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The pipeline cases of train_worker.CASES: one 2-rank and one 4-rank launch beside the single-process runs."""
    out = tmp_path_factory.mktemp("pp_runs")
    port2, port4 = free_ports(2)
    threads = torch.get_num_threads()
    four = start(torchrun(4, port4, str(WORKER), str(out), *FOUR_RANKS), out / "four.log")
    try:
        run_case(out, "single_qk")  # saves the checkpoint pp_from_single starts from
        two = start(torchrun(2, port2, str(WORKER), str(out), *TWO_RANKS), out / "two.log")
        run_case(out, "single_4")
        log = finish(two, out / "two.log", timeout=400)
        assert two.returncode == 0, log[-6000:]
        run_case(out, "single_qk_from_pp")  # from pp_1f1b's checkpoint
    finally:
        torch.set_num_threads(threads)
        log = finish(four, out / "four.log", timeout=400)
    assert four.returncode == 0, log[-6000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case,ref", [
    ("pp_gpipe", "single_qk"), ("pp_1f1b", "single_qk"), ("pp_interleaved", "single_4"),
    ("pp_fsdp", "single_qk"), ("pp_interleaved_fsdp", "single_4"),
])
def test_pipeline_training_matches_one_process(runs, case, ref):
    _assert_same_run(runs, case, ref)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["pp_from_single", "single_qk_from_pp"])
def test_checkpoint_resumes_across_pipeline_layouts(runs, case):
    """1 process → pp 2 and pp 2 → 1 process, from step SAVE_AT: the curve and the weights continue."""
    _assert_same_run(runs, case, "single_qk", first_step=SAVE_AT + 1)
