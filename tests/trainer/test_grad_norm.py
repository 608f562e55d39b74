"""clip_grad_norm: torch's total norm and clipping, for parameters on any mix of meshes (here: plain tensors)."""

import pytest
import torch

from longboat.trainer.grad_norm import clip_grad_norm


def _params(scale: float) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((5, 3), (4,), (2,))]
    for p in params[:2]:
        p.grad = torch.randn_like(p) * scale
    return params  # the last one has no gradient


@pytest.mark.parametrize("max_norm", [float("inf"), 100.0, 0.5])
def test_matches_torch(max_norm):
    ours, theirs = _params(3.0), _params(3.0)
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    torch.testing.assert_close(norm, expected)
    for p, q in zip(ours[:2], theirs[:2]):
        torch.testing.assert_close(p.grad, q.grad)
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours[:2]]))
    assert clipped.item() == pytest.approx(min(max_norm, norm.item()), rel=1e-5)


def test_no_gradients():
    assert clip_grad_norm([torch.nn.Parameter(torch.ones(2))], 1.0).item() == 0.0


def test_a_gradient_counted_elsewhere_is_clipped_but_not_counted():
    """A tied weight's copy on the last pipeline stage: its first stage counts it in the norm."""
    params = _params(3.0)
    copy = torch.nn.Parameter(torch.zeros(3))
    copy.grad = torch.full((3,), 100.0)
    counted = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params[:2]]))
    norm = clip_grad_norm([*params, copy], 0.5, counted_elsewhere=[copy])
    torch.testing.assert_close(norm, counted)
    torch.testing.assert_close(copy.grad, torch.full((3,), 100.0 * 0.5 / (counted.item() + 1e-6)))
