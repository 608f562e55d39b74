import json

import torch
from safetensors.torch import load_file

from longboat.models.policy.lerobot.act import ACT_CONVERTER, vae_positions



def test_weights_round_trip_byte_equal(lerobot_dirs):
    for name in ("act", "act_prenorm"):
        original = load_file(str(lerobot_dirs[name] / "model.safetensors"))
        cfg = ACT_CONVERTER.config_in(json.loads((lerobot_dirs[name] / "config.json").read_text()), "config.json")
        back = ACT_CONVERTER.weights_out(ACT_CONVERTER.weights_in(original, cfg), cfg)
        assert sorted(back) == sorted(original)
        for key, value in original.items():
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            assert back[key].contiguous().numpy().tobytes() == value.numpy().tobytes(), key


def test_vae_positions_are_lerobots_table():
    table = vae_positions(10, 32)[0]
    assert table.dtype == torch.float32 and table.shape == (10, 32)
    assert table[0, 0] == 0 and table[0, 1] == 1 and torch.isclose(table[3, 2], torch.tensor(3 / 10000 ** (2 / 32)).sin())
