import pytest
import torch

from longboat.config.base import ConfigError
from longboat.data.source_files import check_malformed, held_out, read_rows, split_indices


def test_split_is_fixed_disjoint_and_seeded():
    t, v = split_indices(1797, 0.2, 0)
    assert len(v) == 359 and len(t) + len(v) == 1797
    assert not set(t.tolist()) & set(v.tolist())
    assert torch.equal(split_indices(1797, 0.2, 0)[1], v)
    assert not torch.equal(split_indices(1797, 0.2, 1)[1], v)
    with pytest.raises(ConfigError, match=r"holds 2 clips, too few to split"):
        held_out(2, 0.1, 0, "x.csv", "clips")


def test_malformed_are_counted_against_the_threshold():
    check_malformed(["a"], 4, 0.25, "here")  # one of four is allowed at 0.25
    with pytest.raises(ConfigError) as e:
        check_malformed([f"f{i}" for i in range(7)], 8, 0.5, "here", "clips")
    message = str(e.value)
    assert "\n" not in message and "7 of 8 clips in here" in message and "f4 and 2 more" in message
    with pytest.raises(ConfigError, match="holds no clips"):
        check_malformed([], 0, 1.0, "here", "clips")


def test_jsonl_rows_and_bad_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_rows(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n[1]\n')
    with pytest.raises(ConfigError, match=r"rows.jsonl:2: expected an object"):
        read_rows(path)
