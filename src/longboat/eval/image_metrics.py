"""Metrics of generated images that need no download: a small classifier trained here on the real training images scores
whether each sample shows its intended class, and the Fréchet distance between its penultimate features of the
samples and of the real training images is reported beside the real-vs-real floor (held-out real images against
the same training images, the distance two real sets of that size already have).

The classifier trains in seconds on a CPU with a fixed seed, so the same data gives the same judge on every run.
"""

from __future__ import annotations

import torch
from torch import nn

from longboat.data.image_sources import ImageSet

FEATURES = 64  # width of the penultimate layer the Fréchet distance reads


class ImageClassifier(nn.Module):
    """An MLP over the pixels: 256 wide, then ``FEATURES`` wide (the features), then the class logits. Small images
    (thumbnails, 8×8 digits) need no more, and it trains in a few seconds on a CPU."""

    def __init__(self, pixels: int, num_classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(pixels, 256), nn.ReLU(), nn.Linear(256, FEATURES), nn.ReLU())
        self.head = nn.Linear(FEATURES, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def train_classifier(train: ImageSet, epochs: int = 40, batch_size: int = 64, seed: int = 0) -> ImageClassifier:
    """A classifier of ``train``'s classes, trained with Adam from a fixed seed (deterministic on a CPU)."""
    labelled = train.labels >= 0
    images, labels = train.images[labelled], train.labels[labelled]
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ImageClassifier(images[0].numel(), train.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=g)
        for i in range(0, len(order), batch_size):
            batch = order[i:i + batch_size]
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


@torch.no_grad()
def _apply(fn, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    return torch.cat([fn(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


def frechet_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The Fréchet distance between Gaussians fitted to feature sets ``a`` [N, D] and ``b`` [M, D]:
    |mu_a − mu_b|² + Tr(S_a + S_b − 2 (S_a S_b)^½), with Tr((S_a S_b)^½) from the eigenvalues of the symmetric
    S_a^½ S_b S_a^½ (the same spectrum, and numerically stable)."""
    a, b = a.double(), b.double()
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = torch.cov(a.T), torch.cov(b.T)
    w, v = torch.linalg.eigh(s_a)
    root_a = (v * w.clamp(min=0).sqrt()) @ v.T
    cross = torch.linalg.eigvalsh(root_a @ s_b @ root_a).clamp(min=0).sqrt().sum()
    return float((mu_a - mu_b).pow(2).sum() + s_a.trace() + s_b.trace() - 2 * cross)


class ImageJudge:
    """The classifier trained on ``train`` and the real features the distances compare with."""

    def __init__(self, train: ImageSet, valid: ImageSet, seed: int = 0):
        self.classifier = train_classifier(train, seed=seed)
        self.train_features = _apply(self.classifier.features, train.images)
        self.valid = valid
        self.valid_features = _apply(self.classifier.features, valid.images)
        self.floor = frechet_distance(self.valid_features, self.train_features)
        predicted = _apply(self.classifier, valid.images).argmax(1)
        self.valid_accuracy = float((predicted == valid.labels).double().mean())

    def score(self, images: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """Accuracy on the intended ``labels`` (those >= 0), the Fréchet distance to the real training images, the
        real-vs-real floor and their ratio."""
        images = images.float().clamp(-1, 1)
        predicted = _apply(self.classifier, images).argmax(1)
        labelled = labels >= 0
        accuracy = float((predicted[labelled] == labels[labelled]).double().mean()) if labelled.any() else None
        frechet = frechet_distance(_apply(self.classifier.features, images), self.train_features) \
            if len(images) > 1 else float("nan")
        return {"accuracy": accuracy, "frechet": frechet, "frechet_floor": self.floor,
                "frechet_ratio": frechet / self.floor if self.floor > 0 else float("inf"),
                "num_images": len(images), "num_real_held_out": len(self.valid),
                "classifier_real_accuracy": self.valid_accuracy}
