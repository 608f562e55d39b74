"""Robot data transforms, registered by name; importing this package registers every built-in transform.

A pipeline is built from a list such as
``[{type: normalize, features: {action: quantiles}}, {type: resize_pad, keys: [...], size: [224, 224]}]``.
User code registers more with ``@register_transform("name")`` from a run's ``plugins:``.
"""

from longboat.data.robot.transforms import color, delta, image, normalize, pad, select  # noqa: F401  (register)
from longboat.data.robot.transforms.base import (
    Transform,
    TransformError,
    get_transform,
    register_transform,
    transform_names,
)
from longboat.data.robot.transforms.export import load_pipeline, pipeline_assets, pipeline_from_assets
from longboat.data.robot.transforms.pipeline import Pipeline

__all__ = ["Pipeline", "Transform", "TransformError", "get_transform", "load_pipeline", "pipeline_assets",
           "pipeline_from_assets", "register_transform", "transform_names"]
