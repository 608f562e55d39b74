import pytest

from longboat.config.base import ConfigError, validate
from longboat.distributed import ParallelConfig, ParallelDims, resolve_dims
from longboat.models.llm import DecoderConfig, load_preset
from longboat.models.llm.parallel_plan import check_tensor_parallel


@pytest.mark.parametrize(
    "fields,world,dims",
    [
        ({}, 1, ParallelDims(1, 1, 1)),
        ({}, 8, ParallelDims(1, 8, 1)),
        ({"dp_replicate": 2}, 8, ParallelDims(2, 4, 1)),
        ({"tp": 2}, 8, ParallelDims(1, 4, 2)),
        ({"dp_replicate": 2, "dp_shard": 2, "tp": 2}, 8, ParallelDims(2, 2, 2)),
        ({"cp": 2}, 8, ParallelDims(1, 4, 1, cp=2)),
        ({"dp_replicate": 2, "cp": 2}, 8, ParallelDims(2, 2, 1, cp=2)),
    ],
)
def test_dp_shard_takes_the_rest(fields, world, dims):
    assert resolve_dims(ParallelConfig(**fields), world) == dims


def test_a_mesh_that_does_not_fill_the_world_names_the_axes():
    with pytest.raises(ConfigError, match=r"dp_replicate=1 × dp_shard=3 × tp=1 = 3 ranks, but the job has 2"):
        resolve_dims(ParallelConfig(dp_shard=3), 2)
    with pytest.raises(ConfigError, match=r"6 ranks cannot be split as dp_replicate=1 × tp=4"):
        resolve_dims(ParallelConfig(tp=4), 6)
    with pytest.raises(ConfigError, match=r"dp_replicate=1 × dp_shard=2 × cp=2 × tp=1 = 4 ranks, but the job has 2"):
        resolve_dims(ParallelConfig(dp_shard=2, cp=2), 2)


def test_config_rejects_combinations_that_cannot_work():
    with pytest.raises(ConfigError, match="cannot be combined with tensor parallel"):
        validate(ParallelConfig, {"data_parallel": "ddp", "tp": 2})
    with pytest.raises(ConfigError, match="needs parallel.data_parallel=fsdp"):
        validate(ParallelConfig, {"data_parallel": "ddp", "param_dtype": "bf16"})
    with pytest.raises(ConfigError, match="dp_shard"):
        validate(ParallelConfig, {"dp_shard": 0})
    with pytest.raises(ConfigError, match="did you mean 'tp'"):
        validate(ParallelConfig, {"tpp": 2})


def test_tensor_parallel_must_split_whole_heads():
    cfg = DecoderConfig(**load_preset("llama3.2-1b"))  # 32 query heads, 8 key/value heads
    check_tensor_parallel(cfg, 8)
    with pytest.raises(ConfigError, match=r"parallel.tp=16 must divide .* n_kv_heads \(8\)"):
        check_tensor_parallel(cfg, 16)
