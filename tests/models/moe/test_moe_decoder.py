"""Mixture-of-experts and latent-attention decoders: transformers parity, cached generation, training, configs."""

import pytest
import torch
import transformers
from pydantic import ValidationError
from safetensors.torch import load_file

from longboat.models.llm.generation import generate
from longboat.models.llm import Decoder, DecoderConfig
from longboat.models.llm.hf import HFConversionError, get_hf_adapter, load_hf_model, save_hf_model
from longboat.models.llm.parallel_plan import check_tensor_parallel
from longboat.models.llm import load_preset
from longboat.config.base import ConfigError
from longboat.models.moe import MoE
from longboat.tasks.lm_loss import make_lm_loss
from longboat.trainer.config import CheckpointConfig, TrainerConfig
from longboat.trainer.metrics import read_metrics
from longboat.trainer.trainer import Trainer
from tests.trainer.conftest import RandomTokens

COMMON = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, rms_norm_eps=1e-6, max_position_embeddings=64,
              tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def mixtral():
    return transformers.MixtralConfig(**COMMON, intermediate_size=24, num_hidden_layers=2, num_key_value_heads=2,
                                      num_local_experts=4, num_experts_per_tok=2)


def qwen3_moe():
    return transformers.Qwen3MoeConfig(**COMMON, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=3,
                                       num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                       norm_topk_prob=True, mlp_only_layers=[1])


def deepseek_v3(q_lora_rank):
    return transformers.DeepseekV3Config(
        **COMMON, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3, n_routed_experts=8,
        num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
        routed_scaling_factor=2.5, q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8)


def ernie4_5_moe():
    # Experts in layers 0 and 1 (start 0, end 1, every layer), a dense MLP in layer 2.
    return transformers.Ernie4_5_MoeConfig(
        **COMMON, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3, num_key_value_heads=2,
        moe_num_experts=8, moe_k=2, moe_num_shared_experts=2, moe_layer_start_index=0, moe_layer_end_index=1)


FAMILIES = {"mixtral": mixtral, "qwen3_moe": qwen3_moe, "deepseek_v3": lambda: deepseek_v3(16),
            "deepseek_v3_no_q_lora": lambda: deepseek_v3(None), "ernie4_5_moe": ernie4_5_moe}


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    """A random transformers model saved to disk, and ours loaded from that directory."""
    hf_cfg = FAMILIES[request.param]()
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).float().eval()
    with torch.no_grad():  # larger weights than the default init so routing and attention are far from uniform
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.uniform_(0.5, 1.5)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours, cfg, family = load_hf_model(path, dtype=torch.float32)
    return hf, ours, cfg, family


def test_logits_match_transformers(pair):
    hf, ours, cfg, family = pair
    assert cfg.moe is not None
    tokens = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(tokens).logits
        got = ours(tokens)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    aux = ours.moe_aux()
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    assert aux["load"].shape == (n_moe, cfg.moe.n_experts) and (aux["load"].sum(1) == 24 * cfg.moe.top_k).all()


def test_cached_greedy_generation_matches_transformers(pair):
    hf, ours, cfg, family = pair
    prompt = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(2))
    ref = hf.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    got = generate(ours, prompt, 8, temperature=0)
    assert torch.equal(got, ref)
    sampled = generate(ours, prompt, 8, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(0))
    assert sampled.shape == (2, 13)


def test_num_params_and_export_round_trip(pair, tmp_path):
    hf, ours, cfg, family = pair
    # ERNIE keeps the selection bias as a frozen parameter; ours is a buffer, as DeepSeek-V3's is in both.
    hf_params = sum(p.numel() for n, p in hf.named_parameters() if not n.endswith("e_score_correction_bias"))
    assert cfg.num_params() == sum(p.numel() for p in ours.parameters()) == hf_params
    assert cfg.num_params(active=True) < cfg.num_params()
    out = save_hf_model(ours, family, tmp_path / "export")
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.randint(0, 96, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, ours(tokens), atol=1e-4, rtol=1e-4)


def test_hf_tensors_round_trip_byte_equal(pair, tmp_path):
    hf, ours, cfg, family = pair
    adapter = get_hf_adapter(family)
    hf.save_pretrained(tmp_path)
    disk = load_file(tmp_path / "model.safetensors")
    back = adapter.state_dict_to_hf(adapter.state_dict_from_hf(disk, cfg), cfg)
    assert sorted(back) == sorted(disk)
    assert all(torch.equal(back[k], disk[k]) for k in disk)
    if family != "mixtral":  # transformers' Mixtral modules rename block_sparse_moe to mlp; the others keep names
        # transformers' in-memory layout: experts fused into gate_up_proj [E, 2·ffn, d] (gate rows, then up rows).
        fused = {k: v for k, v in hf.state_dict().items() if k in disk or ".experts." in k or "moe_statics" in k}
        assert any(k.endswith("gate_up_proj") for k in fused)
        from_fused, from_disk = adapter.state_dict_from_hf(fused, cfg), adapter.state_dict_from_hf(disk, cfg)
        assert sorted(from_fused) == sorted(from_disk)
        assert all(torch.equal(from_fused[k], from_disk[k]) for k in from_disk)


def test_cached_decode_matches_full_forward_mla_moe():
    cfg = tiny_moe(attention="mla", q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                   v_head_dim=8)
    model = Decoder(cfg).eval()
    x = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        full = model(x)
        cache = model.make_cache(2, 9)
        parts = [model(x[:, :4], cache=cache), model(x[:, 4:5], cache=cache), model(x[:, 5:], cache=cache)]
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def tiny_moe(**kw):
    moe = dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=32, aux_loss="switch", use_expert_bias=True,
               bias_update_rate=1e-2)
    return DecoderConfig(**{**dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                   max_seq_len=32, dense_layers=[0], moe=moe), **kw})


class FewSequences(RandomTokens):
    """Four sequences over and over: a tiny model memorises them within a few steps."""

    def __init__(self, n: int):
        super().__init__(n, 16, 64)

    def __getitem__(self, i):
        return super().__getitem__(i % 4)


def test_training_with_aux_loss_and_expert_bias(tmp_path):
    torch.manual_seed(0)
    cfg = tiny_moe()
    model = Decoder(cfg)
    tcfg = TrainerConfig(steps=16, micro_batch_size=4, grad_accum=2, log_every=1, eval_batches=0, num_workers=0,
                         tensorboard=False, optimizer={"lr": 1e-2})
    trainer = Trainer(tcfg, CheckpointConfig(), tmp_path, model, make_lm_loss(False), FewSequences(256),
                      flops_per_unit=float(cfg.flops_per_token(16)))
    trainer.fit()
    rows = read_metrics(tmp_path)
    losses = [r["loss"] for r in rows]
    assert torch.isfinite(torch.tensor(losses)).all() and sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3
    assert {"moe_aux_loss", "moe_load_max", "moe_load_min", "moe_dropped"} <= rows[0].keys()
    assert rows[0]["moe_aux_loss"] > 0 and rows[0]["moe_load_max"] >= 1 >= rows[0]["moe_load_min"]
    bias = model.layers[1].feed_forward.router.expert_bias
    assert bias.abs().sum() > 0 and int(model.layers[1].feed_forward.load_since_update.sum()) == 0


def test_aux_loss_enters_the_summed_loss_per_token():
    torch.manual_seed(0)
    model = Decoder(tiny_moe()).train()
    batch = RandomTokens(4, 16, 64)[0]
    batch = {k: v[None] for k, v in batch.items()}
    out = make_lm_loss(False)(model, batch)
    aux = model.moe_aux()["loss"]
    model.eval()
    ce = make_lm_loss(False)(model, batch)
    assert out.loss_sum.item() == pytest.approx(ce.loss_sum.item() + aux.item() * 16, rel=1e-5)
    assert ce.metrics is None  # evaluation reports plain cross-entropy


def test_expert_bias_update_only_touches_biased_routers():
    model = Decoder(tiny_moe()).train()
    model(torch.randint(0, 64, (2, 8)))
    model.after_optimizer_step()
    moe = [m for m in model.modules() if isinstance(m, MoE)]
    assert len(moe) == 1 and moe[0].router.expert_bias.abs().sum() > 0


def test_config_accounting():
    cfg = tiny_moe()
    d, e = 32, cfg.moe
    dense = Decoder(tiny_moe(moe=None, dense_layers=[]))
    assert cfg.num_params() - dense.cfg.num_params() == d * e.n_experts + 3 * d * 32 * 4 - 3 * d * 64
    assert cfg.num_params(active=True) == cfg.num_params() - 3 * d * 32 * 2
    assert cfg.flops_per_token(16) == 6 * (cfg.num_params(False, active=True) + 64 * d) + 12 * 2 * 4 * 8 * 16
    assert Decoder(cfg).layers[0].feed_forward.__class__.__name__ == "FeedForward"


def test_config_errors():
    with pytest.raises(ValidationError, match="moe.d_model"):
        tiny_moe(moe=dict(d_model=16, n_experts=4, top_k=2, expert_ffn_dim=8))
    with pytest.raises(ValidationError, match="outside the 2 layers"):
        tiny_moe(dense_layers=[2])
    with pytest.raises(ValidationError, match="dense_layers is set but moe is not"):
        tiny_moe(moe=None)
    with pytest.raises(ValidationError, match="needs kv_lora_rank"):
        tiny_moe(attention="mla", qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    with pytest.raises(ValidationError, match="only apply with attention='mla'"):
        tiny_moe(kv_lora_rank=16)
    check_tensor_parallel(tiny_moe(), 2)
    with pytest.raises(ConfigError, match=r"parallel.tp=2 must divide moe.expert_ffn_dim \(5\): each rank holds"):
        check_tensor_parallel(tiny_moe(moe=dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=5)), 2)
    with pytest.raises(ConfigError, match=r"must divide the shared experts' width .* \(5\)"):
        check_tensor_parallel(tiny_moe(moe=dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=8,
                                                n_shared_experts=1, shared_ffn_dim=5)), 2)
    with pytest.raises(ConfigError, match=r"parallel.tp=3 must divide the model's n_heads \(4\) so that"):
        check_tensor_parallel(tiny_moe(n_kv_heads=None, attention="mla", kv_lora_rank=16, qk_nope_head_dim=8,
                                       qk_rope_head_dim=4, v_head_dim=8), 3)
    llama3 = dict(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=16)
    with pytest.raises(HFConversionError, match="deepseek_v3 exports support only yarn rope_scaling, not 'llama3'"):
        get_hf_adapter("deepseek_v3").config_to_hf(tiny_moe(
            attention="mla", kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
            rope_scaling=llama3, moe=tiny_moe().moe.model_dump() | dict(score_func="sigmoid", use_expert_bias=True)))
    with pytest.raises(HFConversionError, match="mixtral has experts in every layer"):
        get_hf_adapter("mixtral").config_to_hf(tiny_moe(moe=dict(d_model=32, n_experts=4, top_k=2, expert_ffn_dim=8)))


def test_ernie_layer_span_and_errors():
    adapter = get_hf_adapter("ernie4_5_moe")
    hf = ernie4_5_moe().to_dict() | {"num_hidden_layers": 6, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
                                     "moe_layer_interval": 2}
    cfg = DecoderConfig(**adapter.config_from_hf(hf))
    assert cfg.dense_layers == [0, 2, 4] and cfg.moe.topk_norm_min == 1e-12 and cfg.moe.n_shared_experts == 2
    out = adapter.config_to_hf(cfg)
    assert (out["moe_layer_start_index"], out["moe_layer_end_index"], out["moe_layer_interval"]) == (1, 5, 2)
    with pytest.raises(HFConversionError, match="use_bias=True"):
        adapter.config_from_hf(hf | {"use_bias": True})
    with pytest.raises(HFConversionError, match="select no MoE layer"):
        adapter.config_from_hf(hf | {"moe_layer_start_index": 6})
    with pytest.raises(HFConversionError, match=r"dense_layers=\[0, 2, 3, 4\] is not such a pattern"):
        adapter.config_to_hf(cfg.model_copy(update={"dense_layers": [0, 2, 3, 4]}))
    with pytest.raises(HFConversionError, match="moe.topk_norm_min=None"):
        adapter.config_to_hf(cfg.model_copy(update={"moe": cfg.moe.model_copy(update={"topk_norm_min": None})}))
    with pytest.raises(HFConversionError, match="moe.use_expert_bias=False"):
        adapter.config_to_hf(cfg.model_copy(update={"moe": cfg.moe.model_copy(update={"use_expert_bias": False})}))


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"])
def test_presets_validate(name):
    cfg = DecoderConfig(**load_preset(name))
    assert cfg.moe is not None and cfg.num_params(active=True) < cfg.num_params()
