"""``longboat convert``: Hugging Face checkpoint directories and LeRobot policy directories to longboat exports and
back."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from longboat.checkpoint.export import WEIGHTS, save_export
from longboat.config.base import ConfigError
from longboat.data.tokenizer import TOKENIZER_FILE
from longboat.models import hf_spec
from longboat.models.policy import is_lerobot_dir, write_lerobot
from longboat.recipes.artifact import check_hf_fits, export_metadata, open_artifact, open_lerobot
from longboat.recipes.export import read_paths
from longboat.utils.outputs import check_output, staged_output


def hf_to_longboat(hf_dir: str | Path, output: str | Path, dtype: str | None = None, overwrite: bool = False) -> Path:
    """Write our export of an HF checkpoint; tokenizer files and generation_config.json come along.

    An existing ``output`` is replaced only with ``overwrite``, and never when it is or holds ``hf_dir``.
    """
    check_output(output, overwrite, [hf_dir])  # before the model is read, which may take long
    spec = hf_spec(hf_dir)
    check_hf_fits(spec, hf_dir)
    model, cfg, family, assets = spec.hf.load(hf_dir, dtype)
    return save_export(output, model, spec.name, cfg.model_dump(mode="json"), assets,
                       extra={**export_metadata(None, [], False), "hf_family": family, "source": str(hf_dir)},
                       overwrite=overwrite, sources=[hf_dir])


def longboat_to_hf(
    source: str | Path, output: str | Path, family: str | None = None, dtype: str | None = None,
    max_shard_size: int | str = "5GB", overwrite: bool = False,
) -> Path:
    """Write an HF directory from an export, a run directory or a checkpoint.

    The family defaults to the one the export was converted from, else the one the model's config implies.
    An existing ``output`` is replaced only with ``overwrite``, and never when it is or holds what is read.
    """
    check_output(output, overwrite, [source])
    artifact = open_artifact(source)
    spec = artifact.spec
    if spec.hf is None:
        raise ConfigError(f"{source}: model '{spec.name}' has no Hugging Face format")
    model = artifact.model
    if (artifact.source / WEIGHTS).is_file():
        with safe_open(str(artifact.source / WEIGHTS), framework="pt") as f:  # keep the stored dtype
            model = model.to(f.get_tensor(next(iter(f.keys()))).dtype)
    family = spec.hf.export_family(artifact.config, family or artifact.hf_family or True, None)
    tokenizer = artifact.assets.get(TOKENIZER_FILE)
    # The spec writes into an empty staging directory; the guarded swap into ``output`` happens here.
    with staged_output(output, overwrite, read_paths(source, artifact)) as stage:
        spec.hf.save(model, family, stage, artifact.config, dtype=dtype, max_shard_size=max_shard_size,
                     tokenizer_dir=tokenizer.parent if isinstance(tokenizer, Path) else None)
    return Path(output)


def lerobot_to_longboat(source: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Write our export of a LeRobot policy directory: the weights in our architecture, its processors as our
    transform pipeline, ``policy.json`` and LeRobot's ``config.json`` (kept for the way back)."""
    check_output(output, overwrite, [source])
    if not is_lerobot_dir(source):
        raise ConfigError(f"{source}: not a LeRobot policy directory (a config.json with a policy 'type' and "
                          "'input_features')")
    artifact = open_lerobot(Path(source))
    return save_export(output, artifact.model, artifact.arch, artifact.config.model_dump(mode="json"),
                       artifact.assets, extra={**export_metadata("policy", [], False), "source": str(source)},
                       overwrite=overwrite, sources=[source])


def longboat_to_lerobot(source: str | Path, output: str | Path, overwrite: bool = False) -> Path:
    """Write a policy (an export, a run directory or a checkpoint; ACT) in LeRobot's layout, loadable by
    LeRobot's ``from_pretrained`` and its processor loaders."""
    check_output(output, overwrite, [source])
    artifact = open_artifact(source)
    with staged_output(output, overwrite, read_paths(source, artifact)) as stage:
        write_lerobot(stage, artifact.arch, artifact.config.model_dump(mode="json"), artifact.model.state_dict(),
                      artifact.assets, str(source))
    return Path(output)
