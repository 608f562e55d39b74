"""Spatial-softmax keypoints: with standardised heat maps a faint spot still pulls its keypoint to it, where raw
maps of the same features leave the keypoint at the centre."""

import torch
from torch import nn

from longboat.models.vision import SpatialSoftmax


def _faint_spot(row: int, col: int, size: int = 48) -> torch.Tensor:
    features = torch.zeros(1, 1, size, size)
    features[0, 0, row, col] = 1e-2  # the size of logits a small encoder at its initialisation gives
    return features


def test_standardised_maps_find_a_faint_spot_raw_maps_do_not():
    raw, normalized = SpatialSoftmax(1, 1), SpatialSoftmax(1, 1, normalize=True)
    for kp in (raw, normalized):
        nn.init.ones_(kp.proj.weight)
        nn.init.zeros_(kp.proj.bias)
    spot = torch.tensor([[-1 + 2 * 40 / 47, -1 + 2 * 6 / 47]])  # (x, y) of column 40, row 6
    assert raw(_faint_spot(6, 40))[0].abs().max() < 1e-3
    assert torch.allclose(normalized(_faint_spot(6, 40))[0], spot, atol=1e-3)


def test_keypoints_without_normalisation_keep_their_parameters():
    """Checkpoints of policies using raw maps (diffusion) load unchanged; the sharpness is per keypoint."""
    assert set(SpatialSoftmax(8, 4).state_dict()) == {"proj.weight", "proj.bias"}
    kp = SpatialSoftmax(8, 4, normalize=True, sharpness=3.0)
    assert set(kp.state_dict()) == {"proj.weight", "proj.bias", "log_sharpness"}
    assert torch.allclose(kp.log_sharpness.exp(), torch.full((4,), 3.0))
