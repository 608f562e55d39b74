"""Cross-entropy fused with the output head, computed a chunk of tokens at a time.

Full logits [tokens, vocab] are never materialised: each chunk's log-probabilities become their
own gradient in place (softmax - one_hot), and the head's input and weight gradients are accumulated
in the forward pass, so backward is only a rescale. This saves the fp32 upcast of the full logits
under autocast, several full-size passes of log_softmax + nll_loss and their backward, and all head
FLOPs for ignored positions.
"""

from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``hidden @ weight.T`` against ``labels``; every label must be valid."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk: int):  # noqa: D102
        dtype = _compute_dtype(hidden)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            grad_h = torch.empty_like(hidden) if need_grad else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            for start in range(0, hidden.shape[0], chunk):
                h = hidden[start : start + chunk].to(dtype)
                target = labels[start : start + chunk].unsqueeze(1)
                logp = torch.log_softmax(h @ w.T, dim=1, dtype=torch.float32)  # upcast inside the kernel
                total -= logp.gather(1, target).sum()
                if not need_grad:
                    continue
                # d(sum nll)/d logits = softmax - one_hot, built in place over the log-probabilities.
                grad = logp.exp_().scatter_add_(1, target, torch.full_like(target, -1, dtype=logp.dtype))
                grad = grad.to(dtype)
                grad_h[start : start + chunk] = grad @ w
                if dtype == torch.float32:
                    grad_w.addmm_(grad.T, h)
                else:
                    grad_w += grad.T @ h
        if need_grad:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    chunk: int = 1024,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token loss of ``hidden @ weight.T`` against ``labels`` and the count of counted tokens.

    hidden [..., d_model], weight [vocab, d_model], labels [...] (already shifted; ``ignore_index`` skipped).
    Divide the sum by the global count to get the mean the trainer reports.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    valid = y != ignore_index
    n_tokens = valid.sum()
    if int(n_tokens) < y.numel():
        # Ignored positions (prompts, padding) cost no head FLOPs at all; one host sync per call.
        keep = valid.nonzero().squeeze(1)
        h, y = h.index_select(0, keep), y.index_select(0, keep)
    loss_sum = _LinearCrossEntropy.apply(h, weight, y, chunk)
    return loss_sum, n_tokens
