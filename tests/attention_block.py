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


def compiled_matches_eager(model, backend, lengths, device="cpu", dtype=torch.float32, atol=1e-5,
                           rtol=1e-5):
    """torch.compile(fullgraph=True, dynamic=True) of `model` with `backend`, forward and
    backward (input and parameter gradients) for inputs (2, S, dim) of each length, against the
    eager model; returns the compiled module."""
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    dim = model.q.in_features
    for s in lengths:
        x = torch.randn(2, s, dim, device=device, dtype=dtype, requires_grad=True)
        y = compiled(x)
        gy = torch.randn_like(y)
        got = torch.autograd.grad(y, [x, *model.parameters()], gy)
        y_ref = model(x)
        expected = torch.autograd.grad(y_ref, [x, *model.parameters()], gy)
        torch.testing.assert_close(y, y_ref, atol=atol, rtol=rtol)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, atol=atol, rtol=rtol)
    return compiled
