"""The diffusion task on captioned clips (``data.source: video``): a Wan-style model trains on mp4 clips made here
with PyAV, a resumed run equals a straight one bitwise, and bad input ends in one line."""

from __future__ import annotations

import csv
import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from longboat.cli.main import main
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.tasks.diffusion import SPEC_FILE
from tests.tasks.test_text_encoder import encoder_config

WAN = {"arch": "wan", "patch_size": [1, 4, 4], "hidden_size": 48, "num_heads": 2, "depth": 2, "ffn_dim": 96,
       "freq_dim": 32}
DIT = {"arch": "dit", "patch_size": 4, "hidden_size": 32, "depth": 2, "num_heads": 2, "num_classes": 0,
       "frequency_embedding_size": 32}
COLOURS = {"red": (220, 40, 40), "blue": (40, 60, 220)}
pytestmark = pytest.mark.usefixtures("one_thread")


def write_clip(path: Path, colour: tuple[int, int, int], step: int, frames: int = 12, size: int = 16,
               fps: int = 10) -> None:
    """A square of ``colour`` moving ``step`` pixels a frame across a grey field, H.264 at ``fps``."""
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps, options={"g": "4", "crf": "10"})
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            rgb = np.full((size, size, 3), 128, np.uint8)
            x = (2 + i * step) % (size - 4)
            rgb[6:10, x:x + 4] = colour
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def make_clips(root: Path, per_caption: int = 6) -> Path:
    """Wan's metadata.csv of ``per_caption`` clips of each caption ("a red square moves right", ...)."""
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, colour in COLOURS.items():
        for k in range(per_caption):
            write_clip(root / f"{name}{k}.mp4", colour, 1 + k % 2)
            rows.append({"video": f"{name}{k}.mp4", "prompt": f"a {name} square moves right"})
    with (root / "metadata.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, ["video", "prompt"])
        writer.writeheader()
        writer.writerows(rows)
    return root / "metadata.csv"


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    return make_clips(tmp_path_factory.mktemp("clips"))


def config(tmp_path: Path, clips: Path, steps: int = 3, model: dict | None = None, **video) -> dict:
    return {"task": "diffusion", "run_dir": str(tmp_path / "run"), "seed": 3, "model": model or WAN,
            "data": {"source": "video", "video": {"path": str(clips), "frames": 5, "fps": 10, "size": 16, **video},
                     "valid_fraction": 0.2, "cond_dropout": 0.3, "eval_buckets": 2,
                     "text_encoder": encoder_config(cache_dir=str(tmp_path / "cache"))},
            "train": {"steps": steps, "micro_batch_size": 2, "num_workers": 0, "log_every": 1, "eval_every": 2,
                      "eval_batches": 1, "tensorboard": False, "optimizer": {"lr": 3e-3},
                      "schedule": {"kind": "constant"}},
            "checkpoint": {"every": 0}}


def test_wan_trains_on_clips_and_exports_their_shape(tmp_path, clips):
    from longboat.trainer.metrics import read_metrics

    cfg = config(tmp_path, clips, steps=2)
    resolved = resolve(cfg)
    data = resolved.task.build(resolved.model, resolved.cfg.train, resolved.cfg.seed, 1)
    item = data.train[(0, 0)]
    assert item["image"].shape == (3, 5, 16, 16) and item["text"].shape[-1] == 32
    assert data.summary["train_images"] == 10 and data.summary["captions"] == 2
    result = train.run(resolved)
    assert result.step == 2 and torch.isfinite(torch.tensor(result.train_loss))
    spec = json.loads((Path(cfg["run_dir"]) / "export" / SPEC_FILE).read_text())
    assert spec["frames"] == 5 and spec["fps"] == "10" and spec["conditioning"] == "text"
    buckets = [r for r in read_metrics(Path(cfg["run_dir"]), "valid") if "loss/t0.00-0.50" in r]
    assert buckets and all(np.isfinite(r["loss/t0.50-1.00"]) for r in buckets)


def test_a_resumed_run_equals_a_straight_one_bitwise(tmp_path, clips):
    straight = config(tmp_path / "a", clips, steps=4)
    train.run(resolve(straight))
    interrupted = config(tmp_path / "b", clips, steps=2)
    train.run(resolve(interrupted))
    interrupted["train"]["steps"] = 4
    train.run(resolve(interrupted))
    a = load_file(Path(straight["run_dir"]) / "export" / "model.safetensors")
    b = load_file(Path(interrupted["run_dir"]) / "export" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("override, message", [
    ("data.video.frames=6", "'data.video.frames': Value error, 6 is not 1 + 4k"),
    ("model.arch=dit", "data.source: video: model DiTConfig takes images, not clips"),
    ("data.text_encoder=null", "clips are captioned and train text-conditioned models; set data.text_encoder"),
    ("data.video=null", "data.source: video reads the clips data.video names"),
    ("data.video.fps=1", "too short"),
])
def test_bad_input_fails_in_one_line(tmp_path, clips, capsys, override, message):
    path = tmp_path / "clips.yaml"
    cfg = config(tmp_path, clips, model=DIT if override == "model.arch=dit" else None)
    path.write_text(json.dumps(cfg))
    code = main(["train", str(path), override if override != "model.arch=dit" else "seed=3", "--check"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
