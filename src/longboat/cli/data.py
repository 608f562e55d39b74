"""``longboat data``: ``tokenize``, ``train-tokenizer``, ``record``, ``info``, ``encode`` and ``clips`` subcommands."""

from __future__ import annotations

import argparse

from longboat.data.text_sources import TXT_MODES
from longboat.recipes import data as recipe


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``data`` and its subcommands to the main parser's subparsers."""
    parser = subparsers.add_parser("data", help="prepare datasets: tokenize text, train a tokenizer, record and describe a robot dataset, encode latents, "
                                                   "cut captioned clips")
    commands = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    tok = commands.add_parser(
        "tokenize",
        help="tokenize jsonl/parquet/text files into a Megatron .bin/.idx pair",
        description="Tokenize .jsonl(.gz), .parquet and plain text files into NAME.bin + NAME.idx.",
    )
    tok.add_argument("--input", action="append", required=True, metavar="PATH_OR_GLOB",
                     help="input file or glob (quote it); repeat for more")
    tok.add_argument("--tokenizer", required=True, metavar="DIR", help="Hugging Face tokenizer directory")
    tok.add_argument("--output-prefix", required=True, metavar="PREFIX", help="writes PREFIX.bin and PREFIX.idx")
    _add_text_options(tok)
    tok.add_argument("--no-eod", action="store_true", help="do not append the eos token to each document")
    tok.add_argument("--overwrite", action="store_true", help="replace an existing PREFIX.bin/PREFIX.idx")
    tok.add_argument("--workers", type=int, default=None,
                     help="worker processes (default: one per CPU core; with 2 cores or fewer, 1 = encode "
                          "in this process, using the tokenizer's threads)")
    tok.set_defaults(func=_tokenize)

    train = commands.add_parser(
        "train-tokenizer",
        help="train a byte-level BPE tokenizer and save it as a Hugging Face directory",
    )
    train.add_argument("--input", action="append", required=True, metavar="PATH_OR_GLOB",
                       help="input file or glob (quote it); repeat for more")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--output", required=True, metavar="DIR")
    train.add_argument("--min-frequency", type=int, default=2, help="least count for a merge (default 2)")
    train.add_argument("--overwrite", action="store_true", help="replace a non-empty directory at --output")
    _add_text_options(train)
    train.set_defaults(func=_train_tokenizer)

    rec = commands.add_parser(
        "record",
        help="roll out scripted experts in simulators and write a LeRobot v3.0 dataset (pip install longboat[sim])",
        description="Record expert demonstrations (camera video, state, action, task, reward, success) of one or "
                    "more environments into one LeRobot v3.0 dataset.",
    )
    rec.add_argument("--env", action="append", required=True, metavar="SIM:TASK",
                     help="metaworld:<task>-v3 (e.g. metaworld:reach-v3), fetch:reach|push|pick_and_place, "
                          "pusht:push_t, or one a --plugin registers; repeat for more")
    rec.add_argument("--episodes", type=int, default=10, help="episodes per environment (default 10)")
    rec.add_argument("--output", required=True, metavar="DIR", help="the dataset directory to create")
    rec.add_argument("--size", type=int, default=128, help="camera image height and width (default 128)")
    rec.add_argument("--camera", action="append", metavar="NAME",
                     help="a camera every environment has; repeat for more (default: each one's default camera)")
    rec.add_argument("--only-success", action="store_true", help="keep only the episodes that succeeded")
    rec.add_argument("--max-steps", type=int, default=None,
                     help="end an episode after this many steps (default: the simulator's limit)")
    rec.add_argument("--seed", type=int, default=0, help="episode i starts from seed SEED + i (default 0)")
    rec.add_argument("--overwrite", action="store_true", help="replace an existing dataset at --output")
    rec.add_argument("--plugin", action="append", default=[], dest="plugins", metavar="MODULE_OR_FILE",
                     help="import this module or .py file first, to register a simulator and its scripted expert "
                          "(register_simulator); repeatable")
    rec.set_defaults(func=_record)

    info = commands.add_parser(
        "info",
        help="describe a LeRobot dataset (v3.0 or v2.1): features, fps, episodes, frames, tasks, codec",
    )
    info.add_argument("path", metavar="PATH", help="dataset directory (the one holding meta/info.json)")
    info.add_argument("--check", action="store_true",
                      help="also read every data file and open every video; list each problem found (exit 2 if any)")
    info.set_defaults(func=_info)

    enc = commands.add_parser(
        "encode",
        help="encode images or clips with a VAE into a latent cache (safetensors shards + index.json)",
        description="Encode a source's images (or, with --frames, clips) with a VAE into OUTPUT/latents-<hash>/, the "
                    "hash covering the source's files, the preprocessing and the VAE's weights: an unchanged source "
                    "is found and not encoded again. Train on it with data.latents: OUTPUT/latents-<hash>.",
    )
    enc.add_argument("--source", required=True, help="'digits', a folder of class subfolders, a .jsonl / .parquet "
                                                     "file of rows, or with --frames a metadata.csv or rows of clips")
    enc.add_argument("--vae", required=True, metavar="EXPORT_OR_PRESET",
                     help="a VAE export, run, checkpoint or Hugging Face directory, or ARCH:PRESET (random weights)")
    enc.add_argument("--output", required=True, metavar="DIR", help="where the cache directory is written")
    enc.add_argument("--size", type=int, default=256, help="image side (clips: height and width), default 256")
    enc.add_argument("--channels", type=int, choices=(1, 3), default=None,
                     help="image channels (default: the VAE's input channels)")
    enc.add_argument("--frames", type=int, default=None, help="encode clips of this many frames (1 + 4k)")
    enc.add_argument("--fps", default="16", help="clips are read at this frame rate (default 16)")
    enc.add_argument("--batch", type=int, default=8, help="items per encoder call (default 8)")
    enc.add_argument("--latent-channels", type=int, default=None,
                     help="refuse a VAE whose latents have another number of channels")
    enc.add_argument("--max-malformed-fraction", type=float, default=0.0,
                     help="share of unreadable inputs skipped before the command fails (default 0)")
    enc.add_argument("--device", default="cpu", help="where the VAE runs (default cpu)")
    enc.set_defaults(func=_encode)

    clips = commands.add_parser(
        "clips",
        help="cut a LeRobot dataset's camera into captioned mp4 clips with Wan's metadata.csv (video, prompt)",
        description="Cut each episode of a LeRobot dataset into clips of --frames frames at --fps, scaled to cover "
                    "--size × --size and centre-cropped, captioned by the episode's task: OUT/clips/*.mp4 and "
                    "OUT/metadata.csv, what data.source: video (data.video.path: OUT/metadata.csv) trains on.",
    )
    clips.add_argument("dataset", metavar="DATASET", help="LeRobot dataset directory (v3.0 or v2.1)")
    clips.add_argument("out", metavar="OUT", help="the directory to create")
    clips.add_argument("--camera", default=None, help="camera key (default: the dataset's first camera)")
    clips.add_argument("--frames", type=int, default=9, help="frames per clip, 1 + 4k (default 9)")
    clips.add_argument("--fps", default="5", help="clip frame rate, at most the dataset's (default 5)")
    clips.add_argument("--size", type=int, default=32, help="clip height and width (default 32)")
    clips.add_argument("--every", type=float, default=None,
                       help="seconds between clip starts (default: one clip's span, (frames - 1) / fps)")
    clips.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    clips.set_defaults(func=_clips)
    return parser


def _add_text_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text-key", default="text",
                        help="jsonl key / parquet column holding the text (default: text)")
    parser.add_argument("--txt-mode", choices=TXT_MODES, default="file",
                        help="plain text files: one document per file, paragraph or line (default: file)")


def _tokenize(args: argparse.Namespace) -> None:
    recipe.tokenize(
        args.input,
        args.tokenizer,
        args.output_prefix,
        text_key=args.text_key,
        append_eod=not args.no_eod,
        workers=args.workers,
        txt_mode=args.txt_mode,
        overwrite=args.overwrite,
    )


def _train_tokenizer(args: argparse.Namespace) -> None:
    recipe.train_tokenizer(
        args.input,
        args.vocab_size,
        args.output,
        min_frequency=args.min_frequency,
        text_key=args.text_key,
        txt_mode=args.txt_mode,
        overwrite=args.overwrite,
    )


def _record(args: argparse.Namespace) -> None:
    from longboat.utils.plugins import load_plugins

    load_plugins(args.plugins)
    recipe.record(args.env, args.episodes, args.output, cameras=args.camera, image_size=args.size,
                  max_steps=args.max_steps, only_success=args.only_success, seed=args.seed,
                  overwrite=args.overwrite)


def _clips(args: argparse.Namespace) -> None:
    recipe.clips(args.dataset, args.out, camera=args.camera, frames=args.frames, fps=args.fps, size=args.size,
                 every=args.every, overwrite=args.overwrite)


def _info(args: argparse.Namespace) -> None:
    recipe.info(args.path, check=args.check)


def _encode(args: argparse.Namespace) -> None:
    from longboat.config.base import validate
    from longboat.data.latent_cache import LatentSourceConfig

    fields = {"source": args.source, "size": args.size, "channels": args.channels, "frames": args.frames,
              "fps": args.fps, "batch": args.batch, "latent_channels": args.latent_channels,
              "max_malformed_fraction": args.max_malformed_fraction}
    recipe.encode(validate(LatentSourceConfig, fields, "longboat data encode"), args.vae, args.output, args.device)
