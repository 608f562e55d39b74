"""Bitwise pins of the flow VLA's and Diffusion Policy's outputs: a fixed-seed training loss and a keyed action chunk.

The expected values were computed by the code before flow matching and the DDPM/DDIM schedule moved into
``models/generative/``; the move (and any later refactor of those pieces) must leave them bit for bit unchanged."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager

import pytest
import torch

from longboat.models import build_model
from longboat.models.policy.diffusion import DiffusionPolicy
from tests.models.policy.diffusion import test_model as test_diffusion
from tests.models.policy.flow_vla import test_model as test_flow_vla


@contextmanager
def one_thread():
    """Float sums split over threads round differently: the pins hold on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def digest(x: torch.Tensor) -> str:
    return hashlib.sha256(x.detach().contiguous().numpy().tobytes()).hexdigest()[:16]


@one_thread()
def flow_vla_outputs() -> tuple[list[float], str]:
    torch.manual_seed(0)
    model = build_model("flow_vla", test_flow_vla.tiny()).eval()
    batch = test_flow_vla.make_batch()
    return model(batch)["loss"].tolist(), digest(model.predict(batch, batch["noise_key"]))


@one_thread()
def diffusion_outputs(prediction: str) -> tuple[list[float], str]:
    torch.manual_seed(0)
    cfg = test_diffusion.tiny(prediction=prediction)
    model = DiffusionPolicy(cfg).eval()
    batch = test_diffusion.make_batch(cfg, 3)
    obs = {k: v for k, v in batch.items() if k.startswith("observation.")}
    return model(batch)["loss"].tolist(), digest(model.predict(obs, torch.tensor([5, 6, 7])))


# Computed with the code before the move (run this file as a script to print them).
FLOW_VLA = ([1.8046551942825317, 2.931749105453491, 3.1850063800811768, 1.9659018516540527], "25215505b2f605eb")
DIFFUSION = {
    "epsilon": ([1.3810279369354248, 1.4190137386322021, 1.4987728595733643], "c51188ccf6af7cab"),
    "sample": ([0.5576978921890259, 0.5206764340400696, 0.5516892671585083], "f7c144735659bdd4"),
}


def test_flow_vla_loss_and_chunk_are_bitwise_pinned():
    assert flow_vla_outputs() == FLOW_VLA


@pytest.mark.parametrize("prediction", sorted(DIFFUSION))
def test_diffusion_loss_and_chunk_are_bitwise_pinned(prediction):
    assert diffusion_outputs(prediction) == DIFFUSION[prediction]


if __name__ == "__main__":  # how the pins below were computed
    print("FLOW_VLA =", flow_vla_outputs())
    for p in ("epsilon", "sample"):
        print(p, "=", diffusion_outputs(p))
