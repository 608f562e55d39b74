"""Decoder-only transformer (Llama 3 / Qwen2 / Qwen3, Mixtral / Qwen3-MoE, DeepSeek-V3) as plain single-device PyTorch.

x = x + Attention(RMSNorm(x)); x = x + FFN(RMSNorm(x)); logits = output(RMSNorm(x)).
Attention is grouped-query or multi-head latent (``mla.py``); FFN is a SwiGLU or a mixture of experts
(``longboat.models.moe``). Module names follow torchtitan so tensor-parallel plans and checkpoint adapters are
plain name maps. The model never shifts labels and never computes a loss; MoE auxiliary losses of the last
forward are read with ``Decoder.moe_aux()``.

A block has no side effects: an MoE layer's statistics leave it as an output, and the decoder, outside the blocks,
keeps them and adds a training forward's expert loads to the layer's count. So a block checkpointed for activation
recomputation (which runs its forward again in backward) counts each forward once, and compiles as one graph.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from longboat.models.llm.cache import KVCache, chunk_attention_mask
from longboat.models.llm.config import DecoderConfig
from longboat.models.llm.mla import LatentCache, MultiHeadLatentAttention
from longboat.models.llm.rope import apply_rope, mrope_axes, mrope_tables, rope_tables
from longboat.models.moe import MoE
from longboat.models.moe.modality import ModalityMoE


def segment_attention_mask(segments: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T] boolean SDPA mask from segment ids [B, T]: causal, and never across segments.

    Block-diagonal causal attention is exact for packed documents: each one sees only itself, as if alone.
    """
    T = segments.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segments.device).tril()
    return ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]


def one_document_per_row(segments: torch.Tensor) -> bool:
    """Whether each row of segment ids [B, T] is one document followed only by padding (0).

    Causal attention is then exact for every document position, and SDPA's causal kernels skip the masked
    half of the scores that a [T, T] mask makes them compute.
    """
    first = segments[:, :1]
    return bool(((segments == first) | (segments == 0)).all() and (segments[:, 1:] <= segments[:, :-1]).all())


class Attention(nn.Module):
    """Grouped-query attention: n_heads query heads share n_kv_heads key/value heads."""

    def __init__(self, cfg: DecoderConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = hd = cfg.head_size
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * hd, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * hd, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)
        # Qwen3: RMSNorm over each head's vector of q and k, before the rotation.
        self.q_norm = nn.RMSNorm(hd, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(hd, eps=cfg.norm_eps) if cfg.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``mask``: a [B, 1, T, S] boolean mask that replaces the causal one (packed documents, a prefix seen
        bidirectionally); with a ``cache``, its S keys are the cached ones followed by the T new ones."""
        B, T, _ = x.shape
        # Head counts come from the projections (-1), so a tensor-parallel shard of heads works unchanged.
        q = self.wq(x).view(B, T, -1, self.head_dim)
        k = self.wk(x).view(B, T, -1, self.head_dim)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, head_dim]

        causal = mask is None and T > 1
        if cache is not None:
            if mask is None:
                mask, causal = chunk_attention_mask(cache.length, T, x.device)
            k, v = cache.update(self.layer_id, k, v)
        grouped = q.shape[1] != k.shape[1]
        if T == 1 and grouped and mask is None:
            # Single-token decode: fold each group's query heads into the query-length axis, so the
            # group attends to its one kv head as a plain multi-query batch without repeating k/v.
            out = F.scaled_dot_product_attention(q.view(B, k.shape[1], -1, self.head_dim), k, v)
            return self.wo(out.reshape(B, T, -1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=grouped)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def init_weights(self, std: float, out_std: float) -> None:
        for lin in (self.wq, self.wk, self.wv):
            nn.init.normal_(lin.weight, std=std)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        nn.init.normal_(self.wo.weight, std=out_std)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, ffn_dim: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, ffn_dim, bias=False)  # gate
        self.w2 = nn.Linear(ffn_dim, d_model, bias=False)  # down
        self.w3 = nn.Linear(d_model, ffn_dim, bias=False)  # up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w1.weight, std=std)
        nn.init.normal_(self.w3.weight, std=std)
        nn.init.normal_(self.w2.weight, std=out_std)


class Block(nn.Module):
    """One pre-norm transformer layer: (x, cos, sin, ...) -> (x, aux), aux the MoE layer's aux dict (None when dense)."""

    def __init__(self, cfg: DecoderConfig, layer_id: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attention = MultiHeadLatentAttention(cfg, layer_id) if cfg.attention == "mla" else Attention(cfg, layer_id)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.is_moe = cfg.is_moe_layer(layer_id)
        if not self.is_moe:
            self.feed_forward = FeedForward(cfg.d_model, cfg.ffn_dim)
        else:
            self.feed_forward = MoE(cfg.moe) if cfg.vision_moe is None else ModalityMoE(cfg.moe, cfg.vision_moe)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache | LatentCache | None = None,
        mask: torch.Tensor | None = None, vision: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, mask)
        if not self.is_moe:
            return x + self.feed_forward(self.ffn_norm(x)), None
        if isinstance(self.feed_forward, ModalityMoE):
            y, aux = self.feed_forward(self.ffn_norm(x), vision)
        else:
            y, aux = self.feed_forward(self.ffn_norm(x))
        return x + y, aux

    def init_weights(self, std: float, out_std: float) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(std, out_std)
        self.feed_forward.init_weights(std, out_std)


class Decoder(nn.Module):
    """Token ids [B, T] -> next-token logits [B, T, vocab]; optionally fills and reads a KV cache."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        # Tied: the head reads tok_embeddings.weight directly, so there is one parameter and
        # nothing to re-tie after to_empty() or checkpoint loading.
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.max_seq_len, cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.mrope_axes = None if cfg.mrope_section is None else mrope_axes(
            cfg.rope_dim, cfg.mrope_section, cfg.mrope_interleaved, cfg.mrope_alternating)
        self.last_moe_aux: list[dict[str, torch.Tensor]] = []  # the MoE layers' aux dicts of the last forward
        self.init_weights()

    @property
    def output_weight(self) -> torch.Tensor:
        """The [vocab, d_model] matrix of the output head (the embedding table when tied)."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter and recompute the RoPE tables; valid after ``to_empty``, and on a pipeline
        stage that holds only some of the modules."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)  # residual projections, as in GPT-2
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, std=std)
        for layer in self.layers:
            layer.init_weights(std, out_std)
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None:
            nn.init.normal_(self.output.weight, std=std)
        self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute the buffers no checkpoint holds (RoPE tables, MoE load counts) on the weights' device: what a
        model built on the meta device needs once its weights are assigned."""
        cfg, device = self.cfg, next(self.parameters()).device
        self.rope_cos, self.rope_sin = rope_tables(
            cfg.max_seq_len, cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling, device=device
        )
        for module in self.modules():
            if isinstance(module, MoE):
                module.load_since_update = torch.zeros_like(module.load_since_update, device=device)

    def make_cache(
        self, batch: int, max_len: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> KVCache | LatentCache:
        """An empty KV cache for ``batch`` sequences of up to ``max_len`` positions."""
        if max_len > self.cfg.max_seq_len:
            raise ValueError(f"cache of {max_len} positions exceeds max_seq_len {self.cfg.max_seq_len}")
        ref = self.tok_embeddings.weight
        if self.cfg.attention == "mla":
            return LatentCache(
                self.cfg.n_layers, batch, max_len, self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim,
                dtype=dtype or ref.dtype, device=device or ref.device,
            )
        return KVCache(
            self.cfg.n_layers, batch, self.cfg.kv_heads, max_len, self.cfg.head_size,
            dtype=dtype or ref.dtype, device=device or ref.device,
        )

    def moe_aux(self) -> dict[str, torch.Tensor] | None:
        """MoE statistics of the last forward, or None for a dense model.

        ``loss``: the sum over MoE layers of their weighted aux losses (add it to the training loss);
        ``load`` and ``dropped``: routed and dropped token copies per expert, [n_moe_layers, n_experts].
        """
        auxes = self.last_moe_aux
        if not auxes:
            return None
        return {
            "loss": torch.stack([a["loss"] for a in auxes]).sum(),
            "load": torch.stack([a["load"] for a in auxes]),
            "dropped": torch.stack([a["dropped"] for a in auxes]),
        }

    def after_optimizer_step(self, dp_group=None) -> None:
        """Move every bias-balanced MoE router towards equal load (DeepSeek-V3), outside the gradient."""
        for module in self.modules():
            if isinstance(module, MoE) and module.cfg.use_expert_bias:
                module.update_expert_bias(group=dp_group)

    def _rope(
        self, T: int, positions: torch.Tensor | None, cache: KVCache | LatentCache | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions is not None and positions.dim() == 3:  # multimodal [3, B, T]
            if self.mrope_axes is None:
                raise ValueError("positions [3, B, T] are multimodal RoPE's; this decoder has no mrope_section")
            return mrope_tables(self.rope_cos, self.rope_sin, positions, self.mrope_axes)
        if positions is not None:
            return self.rope_cos[positions], self.rope_sin[positions]  # [B, T, head_dim]
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence reaches position {start + T}, beyond max_seq_len {self.cfg.max_seq_len}")
        return self.rope_cos[start : start + T], self.rope_sin[start : start + T]

    def hidden_states(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | LatentCache | None = None,
        segments: torch.Tensor | None = None, layer_inputs: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
        vision: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final normed hidden states [B, T, d_model], the input of the output head.

        A pipeline stage holds only some of the modules: after the first it takes hidden states [B, T, d_model] for
        ``tokens`` (a last stage of a tied model keeps ``tok_embeddings`` for its head), without ``norm`` (a stage
        before the last) it returns its layers' output.
        ``positions`` [B, T] (or [3, B, T] with multimodal RoPE) defaults to 0..T-1, or to the cache's filled length
        onward when decoding; a cache keeps the positions of what it holds. ``segments``
        [B, T] (packed documents): a position attends only to earlier positions with the same segment id; the
        states of padding positions (segment 0) are unspecified. ``layer_inputs`` (index [N], [features [N, d_model],
        ...]): the k-th features are added to the hidden states after layer k at the flat (row · T + column) positions
        ``index`` (DeepStack: a vision tower's early features at the image tokens). ``vision`` [B, T] bool: the
        tokens that experts routed by token type (``vision_moe``) send to the vision group.
        """
        if segments is not None and cache is not None:
            raise ValueError("segments (packed documents) are for training and scoring, not cached decoding")
        cos, sin = self._rope(tokens.shape[1], positions, cache)
        masked = segments is not None and not one_document_per_row(segments)
        mask = segment_attention_mask(segments) if masked else None
        h = tokens if tokens.is_floating_point() else self.tok_embeddings(tokens)
        self.last_moe_aux = []
        added = layer_inputs[1] if layer_inputs is not None else []
        for i, layer in enumerate(self.layers):
            h, aux = layer(h, cos, sin, cache, mask, vision)
            if i < len(added):
                h = h.flatten(0, 1).index_add(0, layer_inputs[0], added[i].to(h.dtype)).view_as(h)
            if aux is not None:
                self.last_moe_aux.append(aux)
                if self.training:
                    layer.feed_forward.record_load(aux["load"])
        if cache is not None:
            T = tokens.shape[1]
            cache.keep_positions(positions if positions is not None else
                                 torch.arange(cache.length, cache.length + T, device=cache.positions.device)[None])
            cache.advance(T)
        return self.norm(h) if self.norm is not None else h

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor | None = None, cache: KVCache | LatentCache | None = None,
        segments: torch.Tensor | None = None, layer_inputs: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
        vision: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.hidden_states(tokens, positions, cache, segments, layer_inputs, vision)
        return F.linear(h, self.output_weight) if self.norm is not None else h
