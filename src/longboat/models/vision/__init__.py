"""Image encoders shared by the policies and the vision-language models (plain PyTorch; no torchvision)."""

from longboat.models.vision.keypoints import SpatialSoftmax
from longboat.models.vision.resnet import ResNet, ResNetConfig
from longboat.models.vision.vit import ViT, ViTConfig

__all__ = ["ResNet", "ResNetConfig", "SpatialSoftmax", "ViT", "ViTConfig"]
