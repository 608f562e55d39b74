import pytest

from longboat.checkpoint.export import ExportError, load_export_weights, save_export
from tests.trainer.conftest import small_model


def test_a_damaged_export_fails_naming_its_weights(tmp_path):
    model = small_model()
    out = save_export(tmp_path / "e", model, "decoder", model.cfg.model_dump(mode="json"))
    weights = out / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:1000])
    with pytest.raises(ExportError, match=r"model.safetensors: not a readable safetensors file"):
        load_export_weights(out, small_model())
    weights.write_bytes(good)
    with pytest.raises(ExportError, match=r"model.safetensors: does not match longboat_config.json"):
        load_export_weights(out, small_model(vocab=64))
