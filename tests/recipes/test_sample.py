"""``longboat sample``: images independent of the batch they are drawn in, guidance as its formula, PNGs and a grid
written whole, the checkpoint's EMA weights equal to the export's, DDIM for DDPM models, bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from longboat.checkpoint.export import EXPORT_CONFIG
from longboat.cli.main import main
from longboat.recipes import train
from longboat.recipes.config import resolve
from longboat.recipes.sample import guided, open_generator, sample_images, text_condition

MODEL = {"arch": "dit", "preset": "tiny", "hidden_size": 32, "depth": 2, "num_heads": 2}


def _train(run_dir: Path, **data) -> Path:
    train.run(resolve({
        "task": "diffusion", "run_dir": str(run_dir), "seed": 1, "model": MODEL,
        "data": {"source": "digits", **data},
        "train": {"steps": 8, "micro_batch_size": 16, "num_workers": 0, "log_every": 4, "eval_batches": 1,
                  "tensorboard": False, "optimizer": {"lr": 3e-3}, "ema": {"decay": 0.5}}}))
    return run_dir


@pytest.fixture(scope="module")
def flow_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("flow") / "run")


def test_each_image_is_a_function_of_its_own_seed(flow_run):
    gen = open_generator(flow_run)
    labels = torch.tensor([3, 1, 4, 1, 5, 9, 2])
    seeds = list(range(100, 107))
    together = sample_images(gen, labels, seeds, steps=4, cfg_scale=2.0, batch_size=7)
    in_threes = sample_images(gen, labels, seeds, steps=4, cfg_scale=2.0, batch_size=3)
    alone = sample_images(gen, labels[4:5], seeds[4:5], steps=4, cfg_scale=2.0)
    torch.testing.assert_close(in_threes, together, rtol=0, atol=1e-5)
    torch.testing.assert_close(alone[0], together[4], rtol=0, atol=1e-5)
    assert not torch.allclose(together[1], together[3])  # same class, other seed
    assert together.shape == (7, 1, 8, 8) and together.min() >= -1 and together.max() <= 1


def test_guidance_is_uncond_plus_scale_times_the_difference(flow_run):
    model = open_generator(flow_run).artifact.model
    x, t, labels = torch.randn(3, 1, 8, 8), torch.rand(3), torch.tensor([0, 5, 7])
    with torch.no_grad():
        cond, uncond = model(x, t, labels), model(x, t, torch.full_like(labels, 10))
        torch.testing.assert_close(guided(model, labels, 10, 3.0)(x, t), uncond + 3.0 * (cond - uncond),
                                   rtol=1e-5, atol=1e-5)
        assert torch.equal(guided(model, labels, 10, 1.0)(x, t), cond)


def test_the_command_writes_one_png_per_image_and_a_grid(flow_run, tmp_path, capsys):
    out = tmp_path / "samples"
    code = main(["sample", str(flow_run), "--class", "2", "--class", "7", "--num", "3", "--steps", "2",
                 "--seed", "5", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    pngs = sorted(p.name for p in out.glob("0*.png"))
    assert pngs == ["00000_class-2_seed-5.png", "00001_class-2_seed-6.png", "00002_class-2_seed-7.png",
                    "00003_class-7_seed-8.png", "00004_class-7_seed-9.png", "00005_class-7_seed-10.png"]
    assert Image.open(out / pngs[0]).size == (8, 8) and Image.open(out / pngs[0]).mode == "L"
    grid = Image.open(out / "grid.png")
    assert grid.size == (3 * 66 + 2, 2 * 66 + 2)  # 8 px cells scaled 8× with 2 px gaps, a row per class
    # The same image from its own seed alone, written by a second command.
    again = tmp_path / "again"
    assert main(["sample", str(flow_run), "--class", "7", "--num", "1", "--steps", "2", "--seed", "9",
                 "--out", str(again)]) == 0
    assert (again / "00000_class-7_seed-9.png").read_bytes() == (out / "00004_class-7_seed-9.png").read_bytes()
    assert main(["sample", str(flow_run), "--num", "1", "--steps", "1", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_checkpoint_samples_as_its_export_with_the_ema_weights(flow_run):
    checkpoint = sorted((flow_run / "checkpoints").glob("step_*"))[-1]
    from_checkpoint, from_export = open_generator(checkpoint), open_generator(flow_run / "export")
    assert from_checkpoint.artifact.ema and from_checkpoint.spec == from_export.spec
    labels, seeds = torch.tensor([0, 8]), [3, 4]
    torch.testing.assert_close(sample_images(from_checkpoint, labels, seeds, 3, 1.5),
                               sample_images(from_export, labels, seeds, 3, 1.5), rtol=0, atol=0)


def test_a_ddpm_model_samples_with_ddim(tmp_path):
    run = _train(tmp_path / "run", objective={"kind": "ddpm", "prediction": "v", "train_timesteps": 100})
    gen = open_generator(run)
    assert gen.objective["kind"] == "ddpm"
    images = sample_images(gen, torch.tensor([1, 2]), [0, 1], steps=5, cfg_scale=2.0)
    assert images.shape == (2, 1, 8, 8) and torch.isfinite(images).all()
    assert main(["sample", str(run), "--sampler", "euler", "--out", str(tmp_path / "x")]) == 2


@pytest.mark.parametrize("args, message", [
    (["--class", "10"], "--class 10: the model knows classes 0..9"),
    (["--sampler", "ddim"], "--sampler ddim: a flow model samples with euler or heun"),
    (["--cfg", "-1"], "--cfg must be 0 or more"),
])
def test_bad_settings_fail_in_one_line(flow_run, tmp_path, capsys, args, message):
    assert main(["sample", str(flow_run), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_an_artifact_that_is_no_image_generator_is_named(flow_run, tmp_path, capsys):
    import shutil

    export = tmp_path / "export"
    shutil.copytree(flow_run / "export", export)
    config = json.loads((export / EXPORT_CONFIG).read_text())
    (export / "diffusion.json").unlink()
    config["assets"] = [a for a in config["assets"] if a != "diffusion.json"]
    (export / EXPORT_CONFIG).write_text(json.dumps(config))
    assert main(["sample", str(export), "--out", str(tmp_path / "o")]) == 2
    assert "not an image generator" in capsys.readouterr().err


@pytest.mark.slow
def test_metrics_are_written_and_printed(flow_run, tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["sample", str(flow_run), "--num", "4", "--steps", "2", "--metrics", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((out / "metrics.json").read_text())
    assert printed == written
    assert {"accuracy", "frechet", "frechet_floor", "frechet_ratio", "num_images"} <= set(written)
    assert written["num_images"] == 40 and written["frechet_floor"] > 0


# ---- text-conditioned models: --prompt ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Path:
    from tests.tasks.test_diffusion_text import config

    root = tmp_path_factory.mktemp("text")
    cfg = config(root, steps=4)
    cfg["train"].update(ema={"decay": 0.5}, threads=1)  # tiny: one thread (the one_thread fixture is per test)
    threads = torch.get_num_threads()
    try:
        train.run(resolve(cfg))
    finally:
        torch.set_num_threads(threads)
    return Path(cfg["run_dir"])


@pytest.mark.usefixtures("one_thread")
def test_a_prompt_image_is_a_function_of_its_own_seed_and_follows_its_prompt(text_run):
    gen = open_generator(text_run)
    (text, mask), null = text_condition(gen, ["a red circle", "a blue square on black"])
    rows = torch.tensor([0, 1, 0, 1, 1])
    cond, seeds = (text[rows], mask[rows]), list(range(50, 55))
    together = sample_images(gen, cond, seeds, steps=3, cfg_scale=3.0, batch_size=5, null=null)
    in_twos = sample_images(gen, cond, seeds, steps=3, cfg_scale=3.0, batch_size=2, null=null)
    alone = sample_images(gen, (text[1:2], mask[1:2]), seeds[3:4], steps=3, cfg_scale=3.0, null=null)
    torch.testing.assert_close(in_twos, together, rtol=0, atol=1e-5)
    torch.testing.assert_close(alone[0], together[3], rtol=0, atol=1e-5)
    assert together.shape == (5, 3, 16, 16)
    other = sample_images(gen, (text[[1]], mask[[1]]), seeds[:1], steps=3, cfg_scale=3.0, null=null)
    assert not torch.allclose(other[0], together[0], atol=1e-4)  # same seed, the other prompt


@pytest.mark.usefixtures("one_thread")
def test_the_command_draws_each_prompt(text_run, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["sample", str(text_run), "--prompt", "a red circle", "--prompt", "a green triangle", "--num", "2",
                 "--steps", "2", "--cfg", "2", "--out", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["00000_prompt-0_seed-0.png", "00001_prompt-0_seed-1.png", "00002_prompt-1_seed-2.png",
                     "00003_prompt-1_seed-3.png", "grid.png", "prompts.json"]
    assert json.loads((out / "prompts.json").read_text()) == ["a red circle", "a green triangle"]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("which, args, message", [
    ("flow", ["--prompt", "a 3"], "--prompt: {run}/export is class-conditional; draw it with --class"),
    ("text", ["--class", "1"], "--class: {run}/export is conditioned on text; draw it with --prompt"),
    ("text", [], "--prompt: {run}/export is conditioned on text; give at least one --prompt"),
    ("flow", ["--frames", "5"], "--frames: {run}/export generates images, not clips; drop --frames"),
])
def test_a_flag_for_the_other_kind_of_model_is_one_line(flow_run, text_run, tmp_path, capsys, which, args, message):
    run = flow_run if which == "flow" else text_run
    assert main(["sample", str(run), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(run=run) in err, err


@pytest.mark.usefixtures("one_thread")
def test_a_changed_text_encoder_is_refused(text_run, tmp_path, capsys):
    import shutil

    export = tmp_path / "export"
    shutil.copytree(text_run / "export", export)
    spec = json.loads((export / "diffusion.json").read_text())
    spec["text_encoder"]["seed"] = 99  # other weights than the model was trained with
    (export / "diffusion.json").write_text(json.dumps(spec))
    assert main(["sample", str(export), "--prompt", "a red circle", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differ from those the model was trained with" in err, err


def test_a_colour_grid_is_white_between_cells():
    from longboat.recipes.sample import grid

    sheet = grid(torch.zeros(2, 3, 4, 4), rows=1)
    assert sheet.getpixel((0, 0)) == (255, 255, 255) and sheet.getpixel((5, 5)) == (128, 128, 128)
