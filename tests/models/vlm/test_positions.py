"""Multimodal RoPE positions equal transformers' ``get_rope_index`` for Qwen2.5-VL, Qwen3-VL and ERNIE-4.5-VL rows with images of
different sizes, restart with each packed sample, and continue after a KV cache."""

from __future__ import annotations

import pytest
import torch

from longboat.models.vlm.positions import mrope_positions

transformers = pytest.importorskip("transformers")

IMG, START, END = 60, 62, 63
GRIDS = torch.tensor([[1, 6, 10], [1, 4, 6], [1, 8, 4]])  # patches; merged 3x5, 2x3, 4x2


def merged(grids: torch.Tensor) -> torch.Tensor:
    return torch.stack([grids[:, 0], grids[:, 1] // 2, grids[:, 2] // 2], dim=1)


def sample(images: list[int], text: int = 3) -> list[int]:
    """Text, then each image between start and end tokens and followed by text."""
    out = list(range(1, 1 + text))
    for n in images:
        out += [START] + [IMG] * n + [END] + list(range(10, 10 + text))
    return out


def hf_positions(family: str, tokens: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    vision = {"depth": 1, "hidden_size": 16, "num_heads": 1}
    text = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 64}
    if family == "ernie4_5_vl_moe":  # its rotary table needs sections of head_dim / 2 (h, w, t)
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 2]}
    else:
        vision["out_hidden_size"] = 32
    config = transformers.AutoConfig.for_model(
        family, vision_config=vision,
        text_config=text,
        image_token_id=IMG, vision_start_token_id=START)
    model = transformers.AutoModel.from_config(config)
    return model.get_rope_index(tokens, mm_token_type_ids=(tokens == IMG).long(), image_grid_thw=grids)[0]


def flat_index(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens == IMG).flatten().nonzero().squeeze(1)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "ernie4_5_vl_moe"])
def test_equal_to_transformers_get_rope_index(family):
    counts = (GRIDS.prod(dim=1) // 4).tolist()
    rows = [sample(counts[:2]), sample(counts[2:], text=5)]
    width = max(map(len, rows))
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])  # padding at the end takes text positions
    want = hf_positions(family, tokens, GRIDS)
    got = mrope_positions(tuple(tokens.shape), flat_index(tokens), merged(GRIDS))
    assert torch.equal(got, want)


def test_packed_samples_are_numbered_as_if_alone():
    counts = (GRIDS.prod(dim=1) // 4).tolist()
    first, second = sample(counts[:2]), sample(counts[2:], text=4)
    alone = [mrope_positions((1, len(s)), flat_index(torch.tensor([s])), merged(g))
             for s, g in ((first, GRIDS[:2]), (second, GRIDS[2:]))]
    row = torch.tensor([first + second + [0, 0]])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second))) + [0, 0]])
    packed = mrope_positions(tuple(row.shape), flat_index(row), merged(GRIDS), positions)
    assert torch.equal(packed[:, :, :len(first)], alone[0])
    assert torch.equal(packed[:, :, len(first):len(first) + len(second)], alone[1])


def test_base_continues_after_a_cache():
    tokens = torch.tensor([sample([6])] * 2)
    base = torch.tensor([7, 11])
    got = mrope_positions(tuple(tokens.shape), flat_index(tokens), torch.tensor([[1, 2, 3]] * 2), base=base)
    plain = mrope_positions(tuple(tokens.shape), flat_index(tokens), torch.tensor([[1, 2, 3]] * 2))
    assert torch.equal(got, plain + base[None, :, None])
    assert plain[:, 0, -1].tolist() == [3 + 1 + 3 + 1 + 2] * 3  # text, start, image (3 wide), end, text
