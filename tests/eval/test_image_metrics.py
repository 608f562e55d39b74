"""The image metrics: the Fréchet distance equals scipy's matrix-square-root formula, and the digits judge tells real
held-out digits (at the floor, the right classes) from noise (far above it, chance accuracy)."""

import numpy as np
import pytest
import torch

from longboat.data.image_sources import ImageSourceConfig, open_split
from longboat.eval.image_metrics import ImageJudge, frechet_distance


def test_frechet_distance_matches_scipys_sqrtm_formula():
    from scipy import linalg

    g = torch.Generator().manual_seed(0)
    a = torch.randn(300, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 6, generator=g, dtype=torch.float64)
    b = torch.randn(200, 6, generator=g, dtype=torch.float64) * 2 + 0.5
    mu_a, mu_b = a.mean(0).numpy(), b.mean(0).numpy()
    s_a, s_b = np.cov(a.numpy(), rowvar=False), np.cov(b.numpy(), rowvar=False)
    expected = ((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * linalg.sqrtm(s_a @ s_b).real)
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-9)
    assert frechet_distance(a, a) == pytest.approx(0, abs=1e-9)


@pytest.mark.slow
def test_the_digits_judge_tells_real_digits_from_noise():
    train, valid = open_split(ImageSourceConfig(source="digits"))
    judge = ImageJudge(train, valid)
    assert judge.valid_accuracy > 0.93
    real = judge.score(valid.images, valid.labels)
    assert real["frechet"] == pytest.approx(judge.floor) and real["frechet_ratio"] == pytest.approx(1.0)
    assert real["accuracy"] == judge.valid_accuracy
    noise = judge.score(torch.randn(360, 1, 8, 8, generator=torch.Generator().manual_seed(0)).clamp(-1, 1),
                        torch.arange(360) % 10)
    assert noise["accuracy"] < 0.3 and noise["frechet_ratio"] > 10
