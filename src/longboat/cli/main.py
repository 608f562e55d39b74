"""``longboat <command>``: parse arguments, load the config, call one entry function. No logic here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from longboat import __version__


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _launch(args: argparse.Namespace) -> int:
    """Run this command on ``--nproc`` ranks through torchrun's launcher (``distributed.launch``)."""
    import os

    from longboat.config.base import ConfigError
    from longboat.distributed.launch import launch_local

    if "WORLD_SIZE" in os.environ:
        raise ConfigError("--nproc starts its own ranks; drop it when launching with torchrun")
    return launch_local(args.nproc, ["-m", "longboat", "train", args.config, *args.overrides])


def _train(args: argparse.Namespace) -> int:
    if args.check:
        return _check(args)
    if args.nproc is not None:
        return _launch(args)
    from longboat.recipes.config import load_run_config

    resolved = load_run_config(args.config, args.overrides)  # a bad config fails before training's imports
    from longboat.recipes import train

    result = train.run(resolved)
    return 0 if not result.stopped_by_signal else 128 + (result.signal or 15)  # the shell's code for that signal


def _check(args: argparse.Namespace) -> int:
    """Validate the run without training: config, data against the model, mesh, resume; print what was found."""
    from longboat.distributed import launched_world_size
    from longboat.recipes.config import load_run_config
    from longboat.recipes.preflight import preflight

    resolved = load_run_config(args.config, args.overrides)
    world = launched_world_size() or args.nproc or 1
    checked = preflight(resolved, world)
    d = checked.dims
    pp = f"pp {d.pp} × " if d.pp > 1 else ""
    cp = f"cp {d.cp} × " if d.cp > 1 else ""
    print(f"ok: task {resolved.cfg.task} · model {resolved.arch} · {world} rank(s): {pp}dp_replicate {d.dp_replicate} × "
          f"dp_shard {d.dp_shard} × {cp}tp {d.tp}"
          + (f" · resumes from {checked.resume_from}" if checked.resume_from else " · starts fresh")
          + (f" · exports HF {checked.hf_family}" if checked.hf_family else ""))
    return 0


def _load_plugins(args: argparse.Namespace) -> None:
    """The plugins the user names (``--plugin``), imported before a model is opened."""
    from longboat.utils.plugins import load_plugins

    load_plugins(args.plugins)


def _generate(args: argparse.Namespace) -> int:
    from longboat.config.base import ConfigError
    from longboat.recipes.sampling import check_sampling

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.num_samples)
    if args.messages is not None and (args.prompt or args.system is not None):
        raise ConfigError("--messages holds the whole conversation; drop --prompt and --system")
    if args.system is not None and not args.chat:
        raise ConfigError("--system needs --chat")
    from longboat.recipes.generate import generate_chat, generate_text, load_for_inference, parse_messages

    messages = parse_messages(args.messages) if args.messages is not None else None
    images = args.images or []
    _load_plugins(args)
    loaded = load_for_inference(args.model)
    if args.chat and messages is None:
        from longboat.recipes.generate import attach_images

        messages = [{"role": "system", "content": args.system}] if args.system is not None else []
        prompt = attach_images(loaded, args.prompt, len(images), "--prompt") if images else args.prompt
        messages.append({"role": "user", "content": prompt})
    elif messages is not None:  # image parts: paths relative to the messages file (or to here)
        from pathlib import Path

        from longboat.recipes.generate import flatten_parts, messages_file

        base = messages_file(args.messages)
        messages, parts = flatten_parts(loaded, messages, base.parent if base is not None else Path("."))
        if parts and images:
            raise ConfigError("--messages holds image parts: drop --image, or use placeholders for its images")
        images = images or parts
    for i in range(args.num_samples):
        sampling = (args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed + i, images)
        if messages is not None:
            text, rate = generate_chat(loaded, messages, *sampling)
            print(text)
        else:
            text, rate = generate_text(loaded, args.prompt, *sampling)
            print(args.prompt + text)
        print(f"[{rate:.0f} tokens/s from {loaded.source}]", file=sys.stderr)
    return 0


def _sample(args: argparse.Namespace) -> int:
    import json

    from longboat.recipes.sample import sample

    _load_plugins(args)
    scores = sample(args.model, args.out, args.classes, args.num, args.steps, args.cfg, args.seed, args.sampler,
                    args.metrics, args.overwrite, args.batch_size, args.device, args.prompts, args.frames)
    print(f"wrote {args.out}/grid.png", file=sys.stderr)
    if args.metrics:
        print(json.dumps(scores, indent=2))
    return 0


def _chat(args: argparse.Namespace) -> int:
    from longboat.recipes.sampling import check_sampling

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
    from longboat.recipes.chat import ChatSession, run_chat
    from longboat.recipes.generate import load_for_inference

    _load_plugins(args)
    loaded = load_for_inference(args.model)
    session = ChatSession(loaded, args.system, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                          args.seed)
    return run_chat(session, sys.stdin, sys.stdout, sys.stderr)


def _eval_lm(args: argparse.Namespace) -> int:
    from longboat.config.base import validate
    from longboat.recipes.eval_lm import EvalLMConfig, run_eval_lm

    fields = ("data", "kind", "batch_size", "limit", "max_new_tokens", "chat", "normalize", "delimiter", "output",
              "overwrite")
    cfg = validate(EvalLMConfig, {k: getattr(args, k) for k in fields}, "eval-lm")
    _load_plugins(args)
    run_eval_lm(args.model, cfg)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from longboat.config.base import ConfigError

    if args.config == "compare":
        from longboat.eval.compare import compare, format_comparison

        if len(args.overrides) != 2:
            raise ConfigError("eval compare: expected two run directories, A and B")
        a, b = args.overrides
        print(format_comparison(compare(a, b), a, b))
        return 0
    from longboat.eval.config import load_eval_config
    from longboat.eval.orchestrator import run_eval
    from longboat.eval.report import REPORT_FILE

    cfg = load_eval_config(args.config, args.overrides)
    overall = run_eval(cfg, progress=not args.no_progress)["overall"]
    low, high = overall["ci95"]
    print(f"success {overall['successes']}/{overall['episodes']} ({overall['success_rate']:.1%}, 95% CI "
          f"{low:.1%}-{high:.1%}); report: {Path(cfg.output_dir) / REPORT_FILE}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from longboat.recipes.export import export_run

    _load_plugins(args)
    print(f"exported to {export_run(args.source, args.output, args.overwrite)}")
    return 0


def _checkpoint_verify(args: argparse.Namespace) -> int:
    from longboat.checkpoint.catalog import checkpoints_at, verify_report
    from longboat.checkpoint.errors import CheckpointError

    damaged = []
    for path in checkpoints_at(args.path):
        problem, checked = verify_report(path)
        print(f"ok       {path}: {checked}" if problem is None else f"DAMAGED  {path}: {problem}", flush=True)
        if problem is not None:
            damaged.append(f"{path}: {problem}")
    if damaged:
        raise CheckpointError(f"{len(damaged)} damaged checkpoint(s): " + "; ".join(damaged))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from longboat.recipes import convert

    _load_plugins(args)
    if args.direction in ("hf-to-longboat", "diffusers-to-longboat"):  # one path: the directory says its format
        out = convert.hf_to_longboat(args.source, args.output, args.dtype, args.overwrite)
    elif args.direction == "lerobot-to-longboat":
        out = convert.lerobot_to_longboat(args.source, args.output, args.overwrite)
    elif args.direction == "longboat-to-lerobot":
        out = convert.longboat_to_lerobot(args.source, args.output, args.overwrite)
    else:
        out = convert.longboat_to_hf(args.source, args.output, args.family, args.dtype, args.max_shard_size,
                                     args.overwrite)
    print(f"converted to {out}")
    return 0


def _quickstart(args: argparse.Namespace) -> int:
    from longboat.recipes import quickstart

    return quickstart.run(args.run_dir, args.steps, args.overrides)


def _serve(args: argparse.Namespace) -> int:
    import os

    from longboat.config.base import ConfigError, validate
    from longboat.recipes.serve import open_served_policy
    from longboat.serving.addresses import check_host
    from longboat.serving.process import resolve_device, serve, set_cpu_threads
    from longboat.serving.random_policy import random_policy
    from longboat.serving.server import ServerConfig

    if (args.path is None) == (args.random_policy is None):
        raise ConfigError("serve: give exactly one of a policy export (PATH) and --random-policy")
    fields = {"host": args.host, "port": args.port, "batch_window_ms": args.batch_window_ms,
              "max_batch": args.max_batch, "deterministic": args.deterministic,
              "max_message_bytes": args.max_message_bytes,
              "api_key": os.environ.get("LONGBOAT_API_KEY") or None}
    cfg = validate(ServerConfig, fields, "serve")
    check_host(cfg.host)
    device = resolve_device(args.device)
    set_cpu_threads(args.threads)
    if args.path is not None:
        _load_plugins(args)
    policy = random_policy(args.random_policy, device) if args.path is None else open_served_policy(args.path, device)
    serve(policy, cfg, verbose=args.verbose, exit_with_stdin=args.exit_with_stdin)
    return 0


def _models(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from longboat.models import get_model, model_names
    from longboat.utils.logging import printable

    for arch in model_names():
        spec = get_model(arch)
        for name in spec.preset_names():
            try:
                cfg = spec.config(**spec.load_preset(name))
            except ValidationError as exc:  # a preset built on inputs made first (e.g. a converted backbone)
                print(f"{name:16s} {arch:10s} (needs {printable(exc.errors()[0]['msg'].removeprefix('Value error, '))})")
                continue
            describe = getattr(cfg, "describe", None)
            print(f"{name:16s} {arch:10s} {describe() if describe else ''}".rstrip())
    return 0


def _add_overwrite(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing non-empty output directory (never the source, a run "
                             "directory or a checkpoint)")


def _add_plugins(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], dest="plugins", metavar="MODULE_OR_FILE",
                        help="import this module or .py file first, to register the model's architecture (and "
                             "what else it needs); repeatable. The plugins an export lists are never imported")


def _add_sampling(parser: argparse.ArgumentParser, max_new_tokens: int) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="at least 1")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding, else positive")
    parser.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (k >= 1)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus sampling, in (0, 1]")
    parser.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    from longboat.cli import data

    parser = argparse.ArgumentParser(prog="longboat", description=__doc__)
    parser.add_argument("--version", action="version", version=f"longboat {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a model; the config's `task` says which kind")
    p.add_argument("config", help="YAML run config (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.steps=100")
    p.add_argument("--nproc", type=_at_least_one, default=None, metavar="N",
                   help="start N ranks on this machine through torchrun (see parallel.* for the layout)")
    p.add_argument("--check", action="store_true",
                   help="validate config, data, mesh and resume compatibility, then exit without training")
    p.set_defaults(func=_train)

    p = sub.add_parser("generate", help="sample text from an export, a run directory, a checkpoint or an HF directory")
    p.add_argument("model", help="export dir, run dir, run_dir/checkpoints/step_N, or a Hugging Face model dir")
    p.add_argument("--prompt", default="")
    p.add_argument("--chat", action="store_true",
                   help="send --prompt as a user turn through the model's chat template; print the reply only")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--messages", default=None, metavar="FILE_OR_JSON",
                   help='the conversation as a JSON list ([{"role": "user", "content": "..."}]) or a file holding '
                        'it; implies --chat')
    p.add_argument("--image", dest="images", action="append", default=None, metavar="PATH",
                   help="an image for a model that reads images (repeatable): they fill the prompt's image "
                        "placeholders in order, or come before its text when it holds none")
    _add_sampling(p, max_new_tokens=128)
    p.add_argument("--num-samples", type=int, default=1, help="at least 1")
    _add_plugins(p)
    p.set_defaults(func=_generate)

    p = sub.add_parser("sample", help="draw images or clips from a generator: a PNG (clips: an mp4) each, grid.png, and metrics")
    p.add_argument("model", help="export dir, run dir or run_dir/checkpoints/step_N of an image generator")
    p.add_argument("--class", type=int, action="append", dest="classes", metavar="N",
                   help="class index to draw (repeatable; default: every class)")
    p.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT",
                   help="caption to draw, for a text-conditioned model (repeatable)")
    p.add_argument("--num", type=_at_least_one, default=8, metavar="K", help="images per class or prompt")
    p.add_argument("--frames", type=int, default=None, metavar="N",
                   help="a video model: frames per clip, 1 + 4k (default: what it was trained on); writes mp4s")
    p.add_argument("--steps", type=_at_least_one, default=32, help="sampler steps")
    p.add_argument("--cfg", type=float, default=1.0, metavar="W",
                   help="classifier-free guidance scale (1: none; above 1 follows the class more)")
    p.add_argument("--seed", type=int, default=0, help="image i is drawn from seed + i")
    p.add_argument("--sampler", choices=["euler", "heun", "ddim"], default=None,
                   help="euler or heun for flow models, ddim for DDPM models (default: euler / ddim)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs, grid.png and metrics.json")
    p.add_argument("--metrics", action="store_true",
                   help="score the images with a classifier trained on the model's training data: accuracy on the "
                        "intended classes and Fréchet distance beside the real-vs-real floor")
    p.add_argument("--batch-size", type=_at_least_one, default=256)
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    _add_overwrite(p)
    _add_plugins(p)
    p.set_defaults(func=_sample)

    p = sub.add_parser("chat", help="talk with a model in the terminal (or through piped stdin)",
                       description="Talk with a model. Commands: /image PATH (attach an image to the next message), "
                                   "/reset (start over), /system TEXT (replace the "
                                   "system message), /exit (or Ctrl-D, Ctrl-C).")
    p.add_argument("model", help="export dir, run dir, run_dir/checkpoints/step_N, or a Hugging Face model dir")
    p.add_argument("--system", default=None, help="system message")
    _add_sampling(p, max_new_tokens=512)
    _add_plugins(p)
    p.set_defaults(func=_chat)

    p = sub.add_parser("eval-lm", help="score a language model on an exact-match or multiple-choice JSONL file")
    p.add_argument("model", help="export dir, run dir, run_dir/checkpoints/step_N, or a Hugging Face model dir")
    p.add_argument("--data", required=True, metavar="FILE.jsonl",
                   help='rows {"prompt" | "messages", "answer"} (exact match) or {"context" | "prompt", "choices", '
                        '"label"} (multiple choice); with "images": [paths relative to the file] for a model that '
                        'reads images')
    p.add_argument("--kind", choices=["auto", "exact_match", "multiple_choice"], default="auto",
                   help="task kind (auto: from the first row's keys)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--limit", type=int, default=None, help="score only the first N rows")
    p.add_argument("--max-new-tokens", type=int, default=64, help="exact match: longest answer generated")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="render prompts with the chat template (default: for exact match when the model has one)")
    p.add_argument("--normalize", choices=["strip", "squad"], default="strip",
                   help="exact match: compare stripped text, or also lower-cased without punctuation and articles")
    p.add_argument("--delimiter", default=" ", help="multiple choice: text between the context and each choice "
                                                     "(empty with --chat)")
    p.add_argument("--output", default=None, metavar="results.json", help="write metrics and per-item predictions")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    _add_plugins(p)
    p.set_defaults(func=_eval_lm)

    p = sub.add_parser("eval", help="evaluate a robot policy in closed loop (`eval CONFIG`), or compare two runs "
                                    "(`eval compare A B`)",
                       description="Run the episodes of an eval config against a policy server (started from an "
                                   "export, or at a URL), resuming from output_dir/results.jsonl; write "
                                   "summary.json and report.html. `longboat eval compare A B` sets two runs side "
                                   "by side.")
    p.add_argument("config", help="an eval YAML config, or 'compare'")
    p.add_argument("overrides", nargs="*", metavar="key=value | RUN_DIR",
                   help="config overrides (e.g. episodes=50); for compare: the two run directories")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_eval)

    p = sub.add_parser("export", help="write a safetensors export from a run directory or a checkpoint")
    p.add_argument("source", help="run dir or run_dir/checkpoints/step_N")
    p.add_argument("--output", required=True)
    _add_overwrite(p)
    _add_plugins(p)
    p.set_defaults(func=_export)

    p = sub.add_parser("checkpoint", help="check checkpoints: `checkpoint verify PATH`")
    commands = p.add_subparsers(dest="checkpoint_command", metavar="SUBCOMMAND", required=True)
    v = commands.add_parser("verify", help="check each file of a checkpoint, or of every complete checkpoint of a run "
                                           "directory, against its manifest (size and checksum)",
                            description="Print one line per checkpoint; exit 2 when any is damaged.")
    v.add_argument("path", help="run_dir/checkpoints/step_N, or a run directory")
    v.set_defaults(func=_checkpoint_verify)

    p = sub.add_parser("convert", help="convert a Hugging Face (transformers or diffusers) checkpoint or a LeRobot "
                                       "policy directory to a longboat export, or back")
    p.add_argument("direction", choices=["hf-to-longboat", "longboat-to-hf", "diffusers-to-longboat",
                                         "longboat-to-diffusers", "lerobot-to-longboat", "longboat-to-lerobot"])
    p.add_argument("source", help="HF directory, a diffusers model's (its transformer/ folder) or a LeRobot policy "
                                  "directory (...-to-longboat); export, run dir or checkpoint (longboat-to-...)")
    p.add_argument("output", help="directory to write")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="weight dtype to write (default: keep the source's)")
    p.add_argument("--family", default=None,
                   help="HF model_type to write (longboat-to-hf; default: the source's, else implied by the config)")
    p.add_argument("--max-shard-size", default="5GB", help="largest safetensors shard (longboat-to-hf)")
    _add_overwrite(p)
    _add_plugins(p)
    p.set_defaults(func=_convert)

    p = sub.add_parser("quickstart", help="train a small model on Shakespeare and print samples (5-15 minutes on 2 CPU cores)")
    p.add_argument("--run-dir", default="runs/quickstart")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.set_defaults(func=_quickstart)

    p = sub.add_parser("serve", help="serve a robot policy to openpi-compatible clients over websockets",
                       description="Serve a policy export over the openpi websocket protocol (openpi-client works "
                                   "unchanged), batching concurrent requests. Set LONGBOAT_API_KEY to require "
                                   "'Authorization: Api-Key <key>'.")
    p.add_argument("path", nargs="?", help="a policy export, or a run directory holding one (export/)")
    p.add_argument("--random-policy", nargs="?", const="{}", default=None, metavar="SPEC",
                   help="serve an untrained MLP instead, for testing clients and measuring the server: a YAML/JSON "
                        "file or inline JSON of its fields (observation, horizon, action_dim, delay_ms, ...)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8000, help="0: any free port")
    p.add_argument("--batch-window-ms", type=float, default=2.0,
                   help="how long a batch waits for more requests (0: one request at a time)")
    p.add_argument("--max-batch", type=int, default=32, help="most requests in one forward pass")
    p.add_argument("--deterministic", action="store_true",
                   help="each request in a forward pass of its own, so its actions never depend on which other "
                        "requests arrive with it (batching off; bitwise reproducible evaluations)")
    p.add_argument("--max-message-bytes", type=int, default=32 << 20, help="larger requests are refused unread")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--threads", type=_at_least_one, default=None,
                   help="torch CPU threads (default: all but one core, which is left to the event loop)")
    p.add_argument("--verbose", action="store_true",
                   help="also log each connection opened and closed and each health check (websockets' INFO lines)")
    p.add_argument("--exit-with-stdin", action="store_true",
                   help="stop gracefully when stdin reaches its end: a process that starts the server and holds the "
                        "pipe to its stdin ends it by ending, however it ends")
    _add_plugins(p)
    p.set_defaults(func=_serve)

    p = sub.add_parser("models", help="list the model presets")
    p.set_defaults(func=_models)

    data.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from longboat.errors import LongboatError
    from longboat.utils.logging import error

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come after options (`train CFG --nproc 2 parallel.tp=2`): argparse leaves them over.
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except LongboatError as e:
        if not getattr(e, "quiet", False):
            error(str(e))
        return e.exit_code
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM where a command turns it into utils.interrupt.Interrupted
        error("interrupted")
        return 128 + getattr(e, "signum", 2)  # the shell's code for that signal
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
