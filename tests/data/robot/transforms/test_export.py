"""An export carries the pipeline (its transforms.json and stats), which serving loads back."""

from __future__ import annotations

import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.robot.transforms import load_pipeline, pipeline_assets
from tests.data.robot.transforms.conftest import TOP, sample


def test_an_export_carries_the_pipeline(pipeline, tmp_path):
    from longboat.checkpoint.export import read_export_config, save_export

    out = save_export(tmp_path / "export", torch.nn.Linear(2, 2), "toy", {}, assets=pipeline_assets(pipeline))
    assert {"transforms.json", "transforms.safetensors"} <= set(read_export_config(out)["assets"])
    served = load_pipeline(out)
    assert not served.training and served.to_dict() == pipeline.to_dict()
    item = sample((2,))
    assert torch.equal(served.apply(item)[TOP], pipeline.eval().apply(item)[TOP])
    (out / "transforms.safetensors").write_bytes(b"broken")
    with pytest.raises(ConfigError, match=r"transforms.safetensors: not a readable safetensors file"):
        load_pipeline(out)
    with pytest.raises(ConfigError, match=r"no transforms.json; the export carries no transform pipeline"):
        load_pipeline(tmp_path)
