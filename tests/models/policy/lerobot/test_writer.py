"""LeRobot -> longboat -> LeRobot through ``longboat convert``: every tensor byte-equal, config and processors kept."""

import json

import pytest
from safetensors.torch import load_file

from longboat.cli.main import main
from longboat.errors import LongboatError
from longboat.recipes.convert import longboat_to_lerobot

from .conftest import TYPES


@pytest.mark.parametrize("name", TYPES)
def test_convert_both_ways_keeps_every_byte(lerobot_dirs, tmp_path, name):
    source = lerobot_dirs[name]
    assert main(["convert", "lerobot-to-longboat", str(source), str(tmp_path / "export")]) == 0
    assert main(["convert", "longboat-to-lerobot", str(tmp_path / "export"), str(tmp_path / "back")]) == 0
    original, back = load_file(str(source / "model.safetensors")), load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(back) == sorted(original)
    for key, value in original.items():
        assert (back[key].dtype, back[key].shape) == (value.dtype, value.shape), key
        assert back[key].numpy().tobytes() == value.numpy().tobytes(), key
    for name_ in ("config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert json.loads((tmp_path / "back" / name_).read_text()) == json.loads((source / name_).read_text()), name_
    for stats in ("policy_preprocessor_step_3_normalizer_processor", "policy_postprocessor_step_0_unnormalizer_processor"):
        ours, theirs = (load_file(str(d / f"{stats}.safetensors")) for d in (tmp_path / "back", source))
        for key, value in ours.items():  # the statistics the normalisation reads (LeRobot also stores unused ones)
            assert value.numpy().tobytes() == theirs[key].numpy().tobytes(), key


def test_a_transform_lerobot_lacks_is_refused(lerobot_dirs, tmp_path):
    main(["convert", "lerobot-to-longboat", str(lerobot_dirs["act"]), str(tmp_path / "export")])
    spec = json.loads((tmp_path / "export" / "transforms.json").read_text())
    spec["transforms"].append({"type": "delta_actions"})
    (tmp_path / "export" / "transforms.json").write_text(json.dumps(spec))
    with pytest.raises(LongboatError) as info:
        longboat_to_lerobot(tmp_path / "export", tmp_path / "back")
    assert "transforms.json" in str(info.value) and "\n" not in str(info.value)
