"""OpRecorder: which ops reach dispatch during a block (the tests of flashcore.patch() and of
flashcore.varlen_attn's routing use it to see that a call went to FlashCore's op)."""
from torch.utils._python_dispatch import TorchDispatchMode


class OpRecorder(TorchDispatchMode):
    """Records the top-level ops that reach dispatch (not what they call internally)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))

    def count(self, op):
        return sum(1 for f in self.ops if f is op)
