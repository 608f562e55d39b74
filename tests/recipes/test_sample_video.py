"""``longboat sample`` on a video generator: each clip a function of its own seed whatever the batch, an mp4 per
clip at the trained frame rate with the frames asked for, a grid of first/middle/last frames, bad --frames in one
line."""

from __future__ import annotations

from pathlib import Path

import av
import pytest
import torch
from PIL import Image

from longboat.cli.main import main
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.recipes.sample import open_generator, sample_images, text_condition
from longboat.recipes.sample_video import key_frames

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def video_run(tmp_path_factory) -> Path:
    from tests.tasks.test_diffusion_video import config, make_clips

    root = tmp_path_factory.mktemp("video")
    cfg = config(root, make_clips(root / "clips", per_caption=3), steps=2)
    cfg["data"]["valid_fraction"] = 0.0
    cfg["train"].update(ema={"decay": 0.5}, threads=1, eval_every=0)
    threads = torch.get_num_threads()
    try:
        train.run(resolve(cfg))
    finally:
        torch.set_num_threads(threads)
    return Path(cfg["run_dir"])


def test_a_clip_is_a_function_of_its_own_seed(video_run):
    gen = open_generator(video_run)
    gen.frames = 9
    (text, mask), null = text_condition(gen, ["a red square moves right", "a blue square moves right"])
    rows = torch.tensor([0, 1, 1])
    cond, seeds = (text[rows], mask[rows]), [7, 8, 9]
    together = sample_images(gen, cond, seeds, steps=2, cfg_scale=2.0, batch_size=3, null=null)
    alone = sample_images(gen, (text[1:2], mask[1:2]), seeds[2:], steps=2, cfg_scale=2.0, null=null)
    assert together.shape == (3, 3, 9, 16, 16)
    torch.testing.assert_close(alone[0], together[2], rtol=0, atol=1e-5)
    assert not torch.allclose(together[1], together[2])  # same prompt, other seed
    picked = key_frames(together)
    assert picked.shape == (9, 3, 16, 16) and torch.equal(picked[5], together[1, :, 8])


def test_the_command_writes_an_mp4_per_clip_and_a_frame_grid(video_run, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["sample", str(video_run), "--prompt", "a red square moves right", "--num", "2", "--steps", "2",
                 "--frames", "9", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["00000_prompt-0_seed-0.mp4", "00001_prompt-0_seed-1.mp4", "grid.png", "prompts.json"]
    with av.open(str(out / names[0])) as video:
        stream = video.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in video.decode(stream)]
        assert stream.average_rate == 10 and len(frames) == 9 and frames[0].shape == (16, 16, 3)
    with Image.open(out / "grid.png") as grid:  # a row of 2 clips × 3 frames, cells scaled to 64 px
        assert grid.size == (2 + 6 * 66, 2 + 66)


@pytest.mark.parametrize("frames", ["6", "0"])
def test_frames_not_one_plus_four_k_are_one_line(video_run, tmp_path, capsys, frames):
    assert main(["sample", str(video_run), "--prompt", "a red square", "--frames", frames, "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--frames {frames}: a clip has 1 + 4k frames (the model was trained on 5)" in err
