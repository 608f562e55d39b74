"""Data commands: tokenize text into a Megatron token dataset, train a tokenizer, record and describe a robot
dataset, encode images or clips into a latent cache, cut a robot dataset into captioned clips."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from longboat.data.latent_cache import LatentSourceConfig, encode_source, malformed_note, read_index
from longboat.data.robot.check import check_dataset
from longboat.data.robot.errors import RobotDataError
from longboat.data.robot.meta import DatasetMeta
from longboat.data.robot.summary import describe
from longboat.data.tokenize import DEFAULT_BATCH_SIZE, TokenizeStats, tokenize_to_indexed
from longboat.data.tokenizer import Tokenizer, train_bpe


def tokenize(
    inputs: Sequence[str],
    tokenizer: str,
    output_prefix: str,
    text_key: str = "text",
    append_eod: bool = True,
    workers: int | None = None,
    txt_mode: str = "file",
    batch_size: int = DEFAULT_BATCH_SIZE,
    overwrite: bool = False,
) -> TokenizeStats:
    """``longboat data tokenize``: write ``output_prefix.bin/.idx``, showing progress and a summary."""
    return tokenize_to_indexed(
        inputs,
        tokenizer,
        output_prefix,
        text_key=text_key,
        append_eod=append_eod,
        workers=workers,
        batch_size=batch_size,
        txt_mode=txt_mode,
        progress=True,
        overwrite=overwrite,
    )


def train_tokenizer(
    inputs: Sequence[str],
    vocab_size: int,
    output: str,
    min_frequency: int = 2,
    text_key: str = "text",
    txt_mode: str = "file",
    overwrite: bool = False,
) -> Tokenizer:
    """``longboat data train-tokenizer``: train a byte-level BPE and save it as an HF directory."""
    tok = train_bpe(inputs, vocab_size, output, min_frequency=min_frequency, text_key=text_key,
                    txt_mode=txt_mode, overwrite=overwrite)
    print(f"saved tokenizer (vocab {tok.vocab_size:,}, eos {tok.eos_token!r} = id {tok.eos_id}) to {output}",
          flush=True)
    return tok


def info(path: str, check: bool = False) -> str:
    """``longboat data info``: print a LeRobot dataset's version, features, episodes, frames, tasks and codecs;
    ``check``: then read every data and video file and list each problem (one error line after them if any)."""
    meta = DatasetMeta(path, check_files=not check)
    text = describe(meta)
    if check:
        report = check_dataset(meta)
        text += "\n" + report.text()
    print(text, flush=True)
    if check and report.problems:
        n = len(report.problems)
        raise RobotDataError(f"{meta.root}: {n} problem{'s' * (n != 1)} in the data files (listed above)")
    return text


def record(
    envs: Sequence[str],
    episodes: int,
    output: str,
    cameras: Sequence[str] | None = None,
    image_size: int = 128,
    max_steps: int | None = None,
    only_success: bool = False,
    seed: int = 0,
    overwrite: bool = False,
) -> Path | None:
    """``longboat data record``: scripted experts in simulators write a LeRobot v3.0 dataset; returns its path."""
    from longboat.sim import record as record_episodes  # imports the simulators' registrations

    return record_episodes(envs, episodes, output, cameras=cameras, image_size=image_size, max_steps=max_steps,
                           only_success=only_success, seed=seed, overwrite=overwrite).output


def encode(cfg: LatentSourceConfig, vae: str, output: str, device: str = "cpu") -> Path:
    """``longboat data encode``: the latent cache of ``cfg.source`` by the VAE at ``vae`` (an export, run or Hugging
    Face directory, or ``ARCH:PRESET`` with seed-0 random weights), found or written under ``output``."""
    from longboat.recipes.latent_vae import latent_encoder

    encoder = latent_encoder(vae, device)
    path, found = encode_source(cfg, encoder, output, progress=True)
    index = read_index(path)
    n = len(index["items"])
    state = "unchanged, not encoded again" if found else f"encoded {n} item{'s' * (n != 1)}"
    print(f"{path}: {state}{malformed_note(index)}", flush=True)
    return path


def clips(dataset: str, out: str, camera: str | None = None, frames: int = 9, fps: float | str = 5, size: int = 32,
          every: float | None = None, overwrite: bool = False) -> dict:
    """``longboat data clips``: a LeRobot dataset's camera cut into captioned clips with Wan's metadata.csv."""
    from longboat.data.robot.clips import export_clips

    counts = export_clips(dataset, out, camera, frames, fps, size, every, overwrite)
    print(f"{out}/metadata.csv: {counts['clips']} clips of {frames} frames at {fps} fps from {counts['episodes']} "
          f"episodes of camera {counts['camera']}, {counts['tasks']} task caption{'s' * (counts['tasks'] != 1)}",
          flush=True)
    return counts
