"""A small attention block for the compile / CUDA-graph tests (tests/test_compile_autograd.py on
the CPU, tests/test_gpu_autograd.py on the GPU): q/kv/o projections, GQA heads, causal
torch.ops.flashcore.sdpa. Not a test module (no test_ prefix): imported by both."""
import torch


class Attention(torch.nn.Module):
    def __init__(self, dim, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, heads * self.d)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(heads * self.d, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.hkv, self.d).permute(2, 0, 3, 1, 4)
        o = torch.ops.flashcore.sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(o.transpose(1, 2).reshape(b, s, self.h * self.d))
