import torch

from longboat.models.vision import ResNet, ResNetConfig


def test_feature_map_shape_and_sample_independence():
    cfg = ResNetConfig(widths=[16, 32], blocks=[1, 1], groups=8)
    net = ResNet(cfg).eval()
    x = torch.randn(3, 3, 64, 48)
    y = net(x)
    assert y.shape == (3, cfg.out_channels, 64 // cfg.stride, 48 // cfg.stride)
    # GroupNorm: a sample's features do not depend on its batch mates.
    torch.testing.assert_close(net(x[1:2]), y[1:2], rtol=1e-5, atol=1e-5)


def test_resnet18_shape_has_its_parameter_count():
    net = ResNet(ResNetConfig(norm="batch"))
    # torchvision's resnet18 without the classifier: 11,176,512 parameters.
    assert sum(p.numel() for p in net.parameters()) == 11_176_512
