"""What this build compiled, for the GPU tests: a trimmed build (FLASHCORE_HEAD_DIMS /
FLASHCORE_DTYPES) leaves kernels out, and a case that needs them skips instead of failing
(the op would fall back to PyTorch there, which is not what the case checks)."""
import pytest

import flashcore


def skip_unless_built(D, dtype):
    """Skip a case whose kernels a trimmed build left out."""
    if not flashcore._built_for(D, dtype):
        pytest.skip(f"this build has no D={D} {dtype} kernels (FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES)")
