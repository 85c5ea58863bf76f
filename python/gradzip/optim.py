"""Optimizers for compressed momentum: AdamW whose variance freezes after a dense warm-up.

Error feedback and Adam do not mix: Adam divides each coordinate by the root of its own running
second moment, so the sign codec's equal-magnitude values (or top-k's delayed, bursty ones)
reach every coordinate at one scale whatever its true gradient, and the residual that error
feedback carries is then applied through a nonlinear map it was not measured in. 1-bit Adam
(Tang et al., ICML 2021) showed the way out: run plain Adam for a warm-up, freeze the variance,
and from then on the update is linear in the momentum, which can be compressed with error
feedback like a gradient under momentum SGD.

FrozenVarianceAdamW is that optimizer for gradzip's DDP hook with momentum correction:

    state = gradzip.torch.GradzipState(model, "sign", warmup=W, momentum_correction=0.9)
    ddp.register_comm_hook(state, gradzip.torch.hook)
    optimizer = gradzip.optim.FrozenVarianceAdamW(model.parameters(), lr=3e-3,
                                                  betas=(0.9, 0.95), freeze_step=W)

The hook hands the optimizer the average over ranks of each rank's momentum u = b1 u + g (with
b1 = momentum_correction, which must equal betas[0]), so p.grad holds U_t = sum_s b1^(t-s) G_s,
G the averaged gradient. Adam's first moment is m_t = (1 - b1) U_t. Until freeze_step the hook
sends uncompressed, so U_t is exact and the gradient is recovered as G_t = U_t - b1 U_(t-1),
which feeds the second moment v as in AdamW: the optimizer is then AdamW (up to rounding). From
step freeze_step + 1 on, v stays as it was (its bias correction too) and the update
lr m_hat / (sqrt(v_hat) + eps) is linear in the compressed momentum. Weight decay is
decoupled (p -= lr * weight_decay * p), as in AdamW. Clip nothing between the hook and this
optimizer: p.grad is a momentum, and scaling it would corrupt the recovered gradients.

With a spec that starts compressing before freeze_step (warmup < freeze_step), the recovered
G is a difference of compressed momenta, and v learns their noise: freeze_step <= warmup.
"""

import torch


class FrozenVarianceAdamW(torch.optim.Optimizer):
    """AdamW on momenta handed over by gradzip's hook with momentum_correction = betas[0], its
    second moment frozen after freeze_step steps (module docstring).

    params, lr, betas, eps, weight_decay: as torch.optim.AdamW.
    freeze_step: the number of steps whose recovered gradients update the second moment (the
        hook's dense warm-up; >= 1).
    state_dict() holds, per parameter, the step, the previous momentum and the second moment."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 freeze_step=1):
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if not eps > 0.0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if int(freeze_step) < 1:
            raise ValueError(f"freeze_step must be >= 1, got {freeze_step}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, freeze_step=int(freeze_step)))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                momentum = p.grad  # U_t: the ranks' averaged momentum
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["previous_momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["second_moment"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                v = state["second_moment"]
                if t <= group["freeze_step"]:
                    gradient = momentum - b1 * state["previous_momentum"]
                    v.mul_(b2).addcmul_(gradient, gradient, value=1.0 - b2)
                state["previous_momentum"].copy_(momentum)
                variance_correction = 1.0 - b2 ** min(t, group["freeze_step"])
                first_moment_scale = (1.0 - b1) / (1.0 - b1 ** t)  # m_hat = scale * U_t
                if group["weight_decay"]:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                denominator = (v / variance_correction).sqrt_().add_(group["eps"])
                p.addcdiv_(momentum, denominator, value=-group["lr"] * first_moment_scale)
        return loss
