import json

from safetensors.torch import load_file

from longboat.models.policy.lerobot.diffusion import DIFFUSION_CONVERTER, keypoint_grid


def test_weights_round_trip_byte_equal(lerobot_dirs):
    for name in ("diffusion", "diffusion_ddpm", "diffusion_crop"):
        original = load_file(str(lerobot_dirs[name] / "model.safetensors"))
        cfg = DIFFUSION_CONVERTER.config_in(json.loads((lerobot_dirs[name] / "config.json").read_text()), "config.json")
        back = DIFFUSION_CONVERTER.weights_out(DIFFUSION_CONVERTER.weights_in(original, cfg), cfg)
        assert sorted(back) == sorted(original)
        for key, value in original.items():
            assert (back[key].dtype, back[key].shape) == (value.dtype, value.shape), key
            assert back[key].contiguous().numpy().tobytes() == value.numpy().tobytes(), key


def test_keypoint_grid_is_x_then_y_row_major():
    grid = keypoint_grid(2, 3)
    assert grid.tolist() == [[-1, -1], [0, -1], [1, -1], [-1, 1], [0, 1], [1, 1]]
