"""Image encoders shared by the policies (plain PyTorch; no torchvision)."""

from longboat.models.vision.resnet import ResNet, ResNetConfig

__all__ = ["ResNet", "ResNetConfig"]
