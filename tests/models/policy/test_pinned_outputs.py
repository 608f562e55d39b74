"""Pins of the flow VLA's and Diffusion Policy's outputs: a fixed-seed training loss and a keyed action chunk.

The values were computed by the code before flow matching and the DDPM/DDIM schedule moved into
``models/generative/``, and the move left them bit for bit unchanged on the machine it was made on. Another CPU's
kernels (convolutions, matmul blocking) round the last bit differently, so the pins hold to a few units in the last
place: any change of the computation itself moves them far more."""

from __future__ import annotations

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


def summary(x: torch.Tensor) -> list[float]:
    """A chunk's sum, absolute sum and first four values."""
    x = x.detach().double().flatten()
    return [x.sum().item(), x.abs().sum().item(), *x[:4].tolist()]


@one_thread()
def flow_vla_outputs() -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    model = build_model("flow_vla", test_flow_vla.tiny()).eval()
    batch = test_flow_vla.make_batch()
    return model(batch)["loss"].tolist(), summary(model.predict(batch, batch["noise_key"]))


@one_thread()
def diffusion_outputs(prediction: str) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    cfg = test_diffusion.tiny(prediction=prediction)
    model = DiffusionPolicy(cfg).eval()
    batch = test_diffusion.make_batch(cfg, 3)
    obs = {k: v for k, v in batch.items() if k.startswith("observation.")}
    return model(batch)["loss"].tolist(), summary(model.predict(obs, torch.tensor([5, 6, 7])))


# The outputs of the code before the move, recomputed on a CPU whose kernels round differently (equal to them within a
# unit or two in the last place); run this file as a script to print them.
FLOW_VLA = ([1.8046551942825317, 2.931749105453491, 3.1850063800811768, 1.9659018516540527],
            [5.57640686, 36.0296232, -0.206045747, -0.883236825, -0.769806266, -1.33509266])
DIFFUSION = {
    "epsilon": ([1.3810279369354248, 1.4190137386322021, 1.4987729787826538],
                [-7.279998, 51.8097817, 0.672330976, 0.966460466, 0.697949648, 0.924376249]),
    "sample": ([0.5576979517936707, 0.5206764936447144, 0.5516893863677979],
               [23.8389493, 28.8332066, 0.106576964, -0.292554468, 0.124805719, 0.093731463]),
}


def close(got: tuple[list[float], list[float]], pinned: tuple[list[float], list[float]]) -> None:
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(pinned[0]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.tensor(got[1], dtype=torch.float64), torch.tensor(pinned[1], dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)


def test_flow_vla_loss_and_chunk_are_pinned():
    close(flow_vla_outputs(), FLOW_VLA)


@pytest.mark.parametrize("prediction", sorted(DIFFUSION))
def test_diffusion_loss_and_chunk_are_pinned(prediction):
    close(diffusion_outputs(prediction), DIFFUSION[prediction])


if __name__ == "__main__":  # how the pins below were computed
    print("FLOW_VLA =", flow_vla_outputs())
    for p in ("epsilon", "sample"):
        print(p, "=", diffusion_outputs(p))
