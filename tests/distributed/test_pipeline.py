"""Pipeline parallelism: the stage split, its config errors and the stage hooks (MoE aux losses, torch's
shape-inference forward) in one process, and real gloo ranks trained with the real Trainer against one process
(losses, gradient norms, final weights) for GPipe, 1F1B, interleaved 1F1B, pp × FSDP, pp × TP, pp × EP, Qwen3-MoE- and
DeepSeek-V3-style decoders (expert biases and load metrics included), and checkpoints moved between pp 2 (× tp 2) and
one process."""

import pytest
import torch
from pydantic import ValidationError
from torch.distributed.tensor.parallel import ColwiseParallel

from longboat.cli.main import main
from longboat.config.base import ConfigError
from longboat.distributed import ParallelConfig, resolve_dims
from longboat.distributed.layout_checks import check_microbatches, stage_layer_counts
from longboat.distributed.pipeline import StageLayers, _keep, _materialize_stages
from longboat.distributed.pipeline_hooks import MICROBATCH, StageHooks, combine_aux
from longboat.distributed.pipeline_tp import check_plan
from longboat.models import build_model, get_model
from longboat.tasks.lm_loss import make_lm_loss
from tests.conftest import REPO
from tests.distributed.conftest import WorkerRuns, assert_bias_balancing_moved
from tests.distributed.test_parallelize import _assert_same_run, _rows
from tests.distributed.train_worker import MODELS, SAVE_AT

WORKER_RUNS = WorkerRuns(
    launches={
        4: ("pp_fsdp", "pp_interleaved_fsdp", "pp_fsdp_deepseek", "pp_interleaved_tp", "pp_tp_deepseek", "pp_ep_qwen3moe",
            "pp_ep_compile_qwen3moe", "pp_fsdp_tied", "pp_tp_tied", "pp4_tied"),
        2: ("pp_gpipe", "pp_1f1b", "pp_interleaved", "pp_from_single", "pp_tied_from_single", "pp_qwen3moe",
            "pp_deepseek", "pp_interleaved_deepseek"),
    },
    # single_qk and single first: pp_from_single and pp_tied_from_single start from their checkpoints
    beside=("single_qk", "single", "single_4", "single_tied_4", "single_qwen3moe_accum", "single_deepseek_accum",
            "single_deepseek_4_accum", "single_qwen3moe_accum_4"),
    after=("single_qk_from_pp", "single_4_from_pp_tp", "single_from_pp_tied"),  # from pp_1f1b, pp_interleaved_tp, pp_fsdp_tied
)


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
])
def test_config_names_the_pipeline_key(fields, match):
    with pytest.raises(ValidationError, match=match):
        ParallelConfig(**fields)


def test_pp_combines_with_tp_and_ep_on_one_mesh():
    assert resolve_dims(ParallelConfig(pp=2, tp=2), 8).dp_shard == 2
    dims = resolve_dims(ParallelConfig(pp=2, ep=2), 8)
    assert (dims.pp, dims.dp_shard, dims.ep) == (2, 4, 2)


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


@pytest.mark.parametrize("model", ["untied_4", "tied_4"])
def test_stages_keep_full_model_names_and_chain_to_the_full_forward(model):
    """A middle stage takes and gives hidden states; the stages in a row compute the full model's logits. A tied
    model's last stage keeps the embedding table its head reads."""
    torch.manual_seed(0)
    full = build_model("decoder", MODELS[model])
    split = get_model("decoder").pipeline_split(full.cfg)
    assert split.tied == (("tok_embeddings",) if model == "tied_4" else ())
    names = full.state_dict().keys()
    stages = []
    for layers, first, last in [((0,), True, False), ((1, 2), False, False), ((3,), False, True)]:
        stage = build_model("decoder", MODELS[model])
        stage.load_state_dict(full.state_dict())
        _keep(stage, split, {str(i): stage.layers[i] for i in layers}, first, last)
        assert isinstance(stage.layers, StageLayers)
        assert set(stage.state_dict()) <= set(names)
        stages.append(stage)
    assert set().union(*(s.state_dict().keys() for s in stages)) == set(names)
    assert {n.split(".")[1] for n in stages[1].state_dict()} == {"1", "2"}
    assert ("tok_embeddings.weight" in stages[2].state_dict()) == (model == "tied_4")
    tokens = torch.randint(0, MODELS[model]["vocab_size"], (2, 9))
    h = tokens
    for stage in stages:
        h = stage(h)
    torch.testing.assert_close(h, full(tokens))


def test_a_stage_plan_is_checked_against_the_full_model():
    """The plan's entries for layers a stage does not keep are not stale, an entry the full model lacks is."""
    model = build_model("decoder", MODELS["untied_qk"])
    plan = get_model("decoder").tensor_parallel_plan(model.cfg, 2)
    check_plan(model, plan)
    with pytest.raises(ConfigError, match="tensor-parallel plan entry 'layers.*.mlp' matches no module of Decoder"):
        check_plan(model, {**plan, "layers.*.mlp": ColwiseParallel()})


def test_meta_init_allocates_and_initialises_a_stage_alone():
    """A stage built on the meta device gets real weights of the usual scale and the full model's RoPE tables; two
    pipeline ranks draw different numbers."""
    split = get_model("decoder").pipeline_split(build_model("decoder", MODELS["deepseek"]).cfg)
    torch.manual_seed(0)
    full = build_model("decoder", MODELS["deepseek"])
    stages = []
    for pp_rank in (0, 1):
        with torch.device("meta"):
            stage = build_model("decoder", MODELS["deepseek"])
        _keep(stage, split, {"1": stage.layers[1]}, first=False, last=False)
        _materialize_stages(stage, torch.device("cpu"), pp_rank)
        stages.append(stage)
    for name, t in [*stages[0].named_parameters(), *stages[0].named_buffers()]:
        assert not t.is_meta and bool(torch.isfinite(t).all()), name
    torch.testing.assert_close(stages[0].rope_cos, full.rope_cos)
    w = stages[0].layers["1"].feed_forward.experts.w13
    assert 0.01 < float(w.detach().std()) < 0.04  # init_std 0.02
    assert not torch.equal(w, stages[1].layers["1"].feed_forward.experts.w13)


def _moe_batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, MODELS["qwen3moe"]["vocab_size"], (2, 9), generator=g)
    labels = torch.randint(0, MODELS["qwen3moe"]["vocab_size"], (2, 9), generator=g)
    labels[0, :4] = -100
    return {"tokens": tokens, "labels": labels, "segments": torch.tensor([[1] * 5 + [2] * 4, [1] * 9])}


@pytest.mark.parametrize("per_sample", [False, True])
def test_the_loss_parts_a_pipeline_splits_add_up_to_the_loss(per_sample):
    """The cross-entropy of the last stage's output plus the aux part of every stage (here all in one) is the loss
    one process computes, count and metrics included."""
    torch.manual_seed(0)
    model = build_model("decoder", MODELS["qwen3moe"]).train()
    loss, batch = make_lm_loss(False, use_segments=per_sample, per_sample=per_sample), _moe_batch(0)
    whole = loss(model, batch)
    args, kwargs = loss.model_inputs(batch)
    ce = loss.output_loss(model(*args, **kwargs), batch)
    aux = loss.aux_loss(model.moe_aux(), batch)
    assert int(aux.count) == int(ce.count) == int(whole.count) == (3 if per_sample else 14)
    torch.testing.assert_close(ce.loss_sum + aux.loss_sum, whole.loss_sum)
    assert aux.metrics == whole.metrics and aux.metrics["moe_aux_loss"] > 0


def test_stage_hooks_add_the_aux_loss_to_the_gradient_and_undo_the_shape_inference_forward():
    """A stage whose output alone is backpropagated gets the gradients of output + weighted aux; the first call for
    micro-batch 0 (torch's shape inference) leaves no expert loads behind; the calls are checked."""
    torch.manual_seed(0)
    model = build_model("decoder", MODELS["qwen3moe"]).train()
    reference = build_model("decoder", MODELS["qwen3moe"]).train()
    reference.load_state_dict(model.state_dict())
    loss, batches = make_lm_loss(False), [_moe_batch(0), _moe_batch(1)]
    hooks = StageHooks(loss, n_microbatches=2)
    hooks.attach(model, stage=0)
    hooks.start(batches, train=True)
    model(batches[0]["tokens"], **{MICROBATCH: torch.tensor([0])})  # the shape inference's run of micro-batch 0
    for i, batch in enumerate(batches):
        model(batch["tokens"], **{MICROBATCH: torch.tensor([i])}).sum().backward()
    hooks.finish()
    auxes = []
    for batch in batches:
        out = reference(batch["tokens"])
        auxes.append(reference.moe_aux())
        (out.sum() + loss.aux_loss(auxes[-1], batch).loss_sum).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    for name, buffer in reference.named_buffers():
        torch.testing.assert_close(model.get_buffer(name), buffer, msg=name)
    assert int(model.layers[0].feed_forward.load_since_update.sum()) == 2 * 2 * 9 * MODELS["qwen3moe"]["moe"]["top_k"]
    for i in range(2):
        for k, v in hooks.aux[0][i].items():
            torch.testing.assert_close(v, auxes[i][k].detach(), msg=k)
    loads = model.layers[0].feed_forward.load_since_update.clone()
    for train in (False, True):  # torch infers the shapes again after each switch between evaluation and training
        model.train(train)
        hooks.start(batches, train)
        for i in (0, 0, 1):
            model(batches[i]["tokens"], **{MICROBATCH: torch.tensor([i])})
        hooks.finish()
        assert bool(hooks.aux) == train
    assert int((model.layers[0].feed_forward.load_since_update - loads).sum()) == int(loads.sum())
    hooks.start(batches, train=True)  # no shape inference expected now: micro-batch 0 twice is an error
    for i in (0, 0, 1):
        model(batches[i]["tokens"], **{MICROBATCH: torch.tensor([i])})
    with pytest.raises(RuntimeError, match=r"pipeline stage 0 ran micro-batches \[0, 0, 1\], expected \[0, 1\]"):
        hooks.finish()


def test_stage_aux_parts_combine_in_stage_order():
    first = {"loss": torch.tensor(0.5), "load": torch.ones(1, 4), "dropped": torch.zeros(1, 4)}
    second = {"loss": torch.tensor(0.25), "load": 2 * torch.ones(2, 4), "dropped": torch.ones(2, 4)}
    whole = combine_aux([first, second])
    assert float(whole["loss"]) == 0.75
    assert whole["load"][:, 0].tolist() == [1, 2, 2] and whole["dropped"].shape == (3, 4)


# The pipeline checks run before the data is read, so these need no corpus.
NO_DATA = ["data.tokenizer=missing", "data.paths=[missing]", "data.seq_len=16", "train.steps=1", "model.n_layers=2",
           "parallel.pp=2", "train.grad_accum=2", "train.eval_batches=2"]


@pytest.mark.parametrize("override,message", [
    ("parallel.pp_layers=[2,1]", "parallel.pp_layers=[2, 1] sums to 3 layers, but the model has 2"),
    ("train.grad_accum=1", "train.grad_accum=1: parallel.pp_schedule=1f1b needs at least one micro-batch per stage"),
    ("train.eval_batches=3", "train.eval_batches=3 must be a multiple of train.grad_accum=2"),
])
def test_train_check_names_the_pipeline_mistake(capsys, override, message):
    code = main(["train", str(REPO / "configs/pretrain/quickstart.yaml"), *NO_DATA, override, "--check", "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


# ---- real ranks --------------------------------------------------------------------------------------------
@pytest.fixture
def runs(worker_runs):
    return worker_runs


@pytest.mark.slow
@pytest.mark.parametrize("case,ref", [
    ("pp_gpipe", "single_qk"), ("pp_1f1b", "single_qk"), ("pp_interleaved", "single_4"),
    ("pp_fsdp", "single_qk"), ("pp_interleaved_fsdp", "single_4"), ("pp_interleaved_tp", "single_4"),
    ("pp_fsdp_deepseek", "single_deepseek_accum"),  # each stage's expert loads summed over its 2 data-parallel ranks
    # tied embeddings: the table on the first and the last stage, over 2 data-parallel or tensor-parallel ranks
    ("pp_fsdp_tied", "single"), ("pp_tp_tied", "single"), ("pp4_tied", "single_tied_4"),
])
def test_pipeline_training_matches_one_process(runs, case, ref):
    # The tied table's gradient adds the first stage's sum over micro-batches to the last stage's, an order one
    # process does not take; at four stages, where the head's and the embedding's parts nearly cancel, the rounding
    # reaches the norm at about 1e-4 by step 11 (the losses still agree to 4e-7).
    _assert_same_run(runs, case, ref, norm_rel=3e-4 if case == "pp4_tied" else 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("case,ref", [
    ("pp_qwen3moe", "single_qwen3moe_accum"), ("pp_deepseek", "single_deepseek_accum"),
    ("pp_interleaved_deepseek", "single_deepseek_4_accum"),
    ("pp_tp_deepseek", "single_deepseek_accum"),  # latent attention's heads and the shared expert split over tp 2
    # each stage's experts split over its 2 data-parallel ranks; the logged moe_* metrics average the micro-batches
    # of both, as one process averages its four
    ("pp_ep_qwen3moe", "single_qwen3moe_accum_4"), ("pp_ep_compile_qwen3moe", "single_qwen3moe_accum_4"),
])
def test_moe_pipeline_training_matches_one_process(runs, case, ref):
    """Losses (aux losses of every stage included), gradient norms, final weights and expert biases, and the load
    metrics of every step."""
    _assert_same_run(runs, case, ref)
    got, want = _rows(runs / case), _rows(runs / ref)
    for step, row in got.items():
        for key in ("moe_aux_loss", "moe_load_max", "moe_load_min", "moe_dropped"):
            assert row[key] == pytest.approx(want[step][key], rel=1e-5, abs=1e-7), f"{case}: {key}, step {step}"
    if "deepseek" in case:
        assert_bias_balancing_moved(runs / ref)
        assert any("expert_bias" in name for name in torch.load(runs / case / "final.pt", weights_only=True))


@pytest.mark.slow
@pytest.mark.parametrize("case,ref", [
    ("pp_from_single", "single_qk"), ("single_qk_from_pp", "single_qk"), ("single_4_from_pp_tp", "single_4"),
    ("pp_tied_from_single", "single"), ("single_from_pp_tied", "single"),
])
def test_checkpoint_resumes_across_pipeline_layouts(runs, case, ref):
    """1 process → pp 2, pp 2 → 1 process and pp 2 × tp 2 → 1 process, from step SAVE_AT: the curve and the
    weights continue. (pp_from_single builds its model on the meta device, parallel.meta_init.)"""
    _assert_same_run(runs, case, ref, first_step=SAVE_AT + 1)
