import json

import pytest

from longboat.models.diffusion.diffusers_interop import load_diffusers, read_config, read_state_dict
from longboat.models.diffusion.dit_diffusers import DIT_FORMAT
from longboat.models.llm.hf.adapter import HFConversionError


def test_broken_directories_are_named(tmp_path):
    with pytest.raises(HFConversionError, match="no config.json"):
        read_config(tmp_path, "DiTTransformer2DModel")
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel"}))
    with pytest.raises(HFConversionError, match="_class_name 'WanTransformer3DModel' is not DiTTransformer2DModel"):
        load_diffusers(DIT_FORMAT, tmp_path)
    with pytest.raises(HFConversionError, match="no diffusion_pytorch_model.safetensors"):
        read_state_dict(tmp_path)
    (tmp_path / "diffusion_pytorch_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(HFConversionError, match="cannot read safetensors weights"):
        read_state_dict(tmp_path)
    (tmp_path / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors"}}))
    with pytest.raises(HFConversionError, match="no diffusion_pytorch_model-00001-of-00002.safetensors"):
        read_state_dict(tmp_path)
