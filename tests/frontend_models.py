"""PyTorch models the frontend tests and the GPU demo share: plain PyTorch, nothing of pyrunner."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DecoderBlock(nn.Module):
    """RMSNorm -> QKV projection -> scaled attention -> output projection -> residual -> RMSNorm -> SwiGLU
    MLP -> residual, on one sequence x[tokens, d]. Head weights are [d, heads, head_dim] (einsum), so no
    view has to split an axis."""

    def __init__(self, d: int = 256, heads: int = 2, head_dim: int = 64, ffn: int = 512, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def p(*shape: int, fan_in: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=g) * fan_in ** -0.5)

        self.norm1 = nn.RMSNorm(d, eps=1e-6)
        self.norm2 = nn.RMSNorm(d, eps=1e-6)
        with torch.no_grad():
            self.norm1.weight.copy_(1 + 0.1 * torch.randn(d, generator=g))
            self.norm2.weight.copy_(1 + 0.1 * torch.randn(d, generator=g))
        self.wq, self.wk, self.wv = (p(d, heads, head_dim, fan_in=d) for _ in range(3))
        self.wo = p(heads, head_dim, d, fan_in=heads * head_dim)
        self.w_gate, self.w_up = p(d, ffn, fan_in=d), p(d, ffn, fan_in=d)
        self.w_down = p(ffn, d, fan_in=ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        q = torch.einsum("td,dhk->htk", h, self.wq)
        k = torch.einsum("td,dhk->htk", h, self.wk)
        v = torch.einsum("td,dhk->htk", h, self.wv)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + torch.einsum("htk,hkd->td", a, self.wo)
        h = self.norm2(x)
        return x + (F.silu(h @ self.w_gate) * (h @ self.w_up)) @ self.w_down
