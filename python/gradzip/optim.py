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
G the averaged gradient. Until freeze_step the hook sends uncompressed, so U_t is exact and the
gradient is recovered as G_t = U_t - b1 U_(t-1). During that warm-up the optimizer is AdamW on
the recovered gradients (up to rounding), clipped together to max_grad_norm first, as a training
loop clips before AdamW: its own first and second moments are fed the clipped G_t. At
freeze_step the second moment is floored (below) and frozen, its bias correction too; from step
freeze_step + 1 on, the first moment is the compressed momentum, m_t = (1 - b1) U_t, and the
update lr m_hat / (sqrt(v_hat) + eps) is linear in it. Nothing is clipped then, and the caller
must never clip: p.grad is a momentum, and scaling it would corrupt the recovered gradients.
Weight decay is decoupled (p -= lr * weight_decay * p), as in AdamW.

Why the floor: a coordinate that received almost no gradient during the warm-up (the embedding
row of a rare token) freezes a second moment near zero, and every later step divides its
momentum by that root. variance_floor raises each frozen entry to at least that fraction of its
tensor's mean second moment, which bounds those steps.

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
    max_grad_norm: the recovered gradients of every parameter still in its warm-up are scaled
        together so that their total 2-norm is at most this (torch.nn.utils.clip_grad_norm_'s
        rule); None clips nothing. 1.0, the usual setting for transformers, by default.
    variance_floor: at the freeze each second-moment entry is raised to at least this times its
        tensor's mean second moment; 0 keeps it as it is. 0.01 by default.
    state_dict() holds, per parameter, the step and the second moment, and until the freeze the
    previous momentum and the first moment (dropped after it: the frozen optimizer keeps one
    tensor per parameter)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 freeze_step=1, max_grad_norm=1.0, variance_floor=0.01):
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if not eps > 0.0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if int(freeze_step) < 1:
            raise ValueError(f"freeze_step must be >= 1, got {freeze_step}")
        if max_grad_norm is not None and not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        if not variance_floor >= 0.0:
            raise ValueError(f"variance_floor must be >= 0, got {variance_floor}")
        self.max_grad_norm = max_grad_norm
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, freeze_step=int(freeze_step),
                                      variance_floor=float(variance_floor)))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # First every parameter's step count, and the recovered gradients of those still in
        # their warm-up: their clipping scale needs them all.
        warming = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["second_moment"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["first_moment"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["previous_momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                if state["step"] <= group["freeze_step"]:
                    gradient = p.grad - group["betas"][0] * state["previous_momentum"]
                    state["previous_momentum"].copy_(p.grad)
                    warming.append((group, state, gradient))
        if warming and self.max_grad_norm is not None:
            total = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g) for _, _, g in warming]))
            scale = torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0)
            for _, _, gradient in warming:
                gradient.mul_(scale)
        for group, state, gradient in warming:
            b1, b2 = group["betas"]
            state["first_moment"].mul_(b1).add_(gradient, alpha=1.0 - b1)
            v = state["second_moment"]
            v.mul_(b2).addcmul_(gradient, gradient, value=1.0 - b2)
            if state["step"] == group["freeze_step"] and group["variance_floor"] > 0.0:
                v.clamp_(min=group["variance_floor"] * v.mean())
        for group in self.param_groups:
            b1, b2 = group["betas"]
            freeze = group["freeze_step"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                t = state["step"]
                if t <= freeze:  # m_hat from the clipped recovered gradients
                    first_moment, first_moment_scale = state["first_moment"], 1.0 / (1.0 - b1 ** t)
                else:  # m_hat = (1 - b1) U_t / (1 - b1^t), U_t the compressed momentum
                    first_moment, first_moment_scale = p.grad, (1.0 - b1) / (1.0 - b1 ** t)
                variance_correction = 1.0 - b2 ** min(t, freeze)
                if group["weight_decay"]:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                denominator = (state["second_moment"] / variance_correction).sqrt_().add_(group["eps"])
                p.addcdiv_(first_moment, denominator, value=-group["lr"] * first_moment_scale)
                if t == freeze:  # from now on only the frozen second moment is needed
                    del state["first_moment"], state["previous_momentum"]
        return loss
