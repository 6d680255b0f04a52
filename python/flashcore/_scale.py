"""SDPA's softmax scale, defined once for the Python side (the C++ ops' is sdpa_scale in
torch_op/op_common.h): the caller's, else 1 / sqrt(head_dim), PyTorch's default."""
import math


def sdpa_scale(scale, head_dim) -> float:
    return (1.0 / math.sqrt(head_dim)) if scale is None else scale
