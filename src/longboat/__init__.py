"""longboat: train language models and robot policies with one torch.distributed engine."""

__version__ = "0.1.0"
