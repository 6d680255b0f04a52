"""An install of FlashCore without its compiled library (issue 36: CPU-only install).

What it checks, on any machine (CPU only, no GPU needed):
  * a copy of the package's Python files with no libflashcore*.so (what setup.py installs where
    nvcc is missing) imports; flashcore.FALLBACK_ONLY says why; explain() answers "fallback: ...";
    torch.ops.flashcore.sdpa equals F.scaled_dot_product_attention bit for bit (GQA, causal,
    masks), is contiguous, has PyTorch's gradients, traces under torch.compile(fullgraph=True);
    flashcore.patched() routes to it; explain_training says "aten: ..."; a CUDA tensor (a fake
    one here) warns once that the kernels are missing;
  * setup.py with no CUDA compiler on PATH: FLASHCORE_REQUIRE_CUDA=1 fails at once with one line;
    without it, the build makes a py3-none-any wheel holding no library and a build record
    saying no kernels were compiled.
Each check runs in a subprocess: the installed/in-tree flashcore of the test session already
registered the C++ op in this process.
Run:  python -m pytest tests/test_fallback.py -q
"""
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _package_dir():
    """The flashcore under test (tests/conftest.py picks the working tree or the installed copy)."""
    spec = importlib.util.find_spec("flashcore")
    assert spec is not None and spec.origin, "flashcore is not importable"
    return os.path.dirname(spec.origin)


@pytest.fixture(scope="module")
def no_library(tmp_path_factory):
    """A copy of the package's Python files only: no libflashcore*.so, no build record."""
    root = tmp_path_factory.mktemp("fallback")
    shutil.copytree(_package_dir(), root / "flashcore",
                    ignore=shutil.ignore_patterns("*.so", "_build_config.py", "__pycache__"))
    return root


def _run(code, pythonpath, env=None):
    env = dict(os.environ if env is None else env, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=str(pythonpath),
                          capture_output=True, text=True, timeout=300)


def test_import_and_fall_back(no_library):
    r = _run("""
        import warnings
        import torch, torch.nn.functional as F
        import flashcore
        assert flashcore.__file__.startswith(%r), flashcore.__file__
        assert "no compiled library" in flashcore.FALLBACK_ONLY, flashcore.FALLBACK_ONLY
        assert not flashcore._built_for(64, torch.float16)
        torch.manual_seed(0)
        q = torch.randn(2, 8, 33, 64, requires_grad=True)
        k = torch.randn(2, 2, 40, 64, requires_grad=True)
        v = torch.randn(2, 2, 40, 64, requires_grad=True)
        mask = torch.rand(33, 40) > 0.3
        assert flashcore.explain(q, k, v).startswith("fallback: this flashcore install")
        assert flashcore.explain_training(q, k, v).startswith("aten: ")
        for kw in (dict(is_causal=True, enable_gqa=True), dict(attn_mask=mask, enable_gqa=True),
                   dict(scale=0.3, enable_gqa=True)):
            out = torch.ops.flashcore.sdpa(q, k, v, **kw)
            ref = F.scaled_dot_product_attention(q, k, v, **kw)
            # the C++ op's layout: the query's storage order (here contiguous), torch.empty's strides
            assert torch.equal(out, ref) and out.stride() == (8 * 33 * 64, 33 * 64, 64, 1), kw
            grads = torch.autograd.grad(out.sum(), (q, k, v))
            refs = torch.autograd.grad(ref.sum(), (q, k, v))
            assert all(torch.equal(a, b) for a, b in zip(grads, refs)), kw
        with flashcore.patched():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert torch.equal(out, flashcore.sdpa(q, k, v, is_causal=True, enable_gqa=True))
        f = torch.compile(lambda a, b, c: torch.ops.flashcore.sdpa(a, b, c, enable_gqa=True),
                          fullgraph=True, backend="eager")
        with torch.no_grad():
            assert torch.allclose(f(q, k, v), F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        # A GPU machine with this install: one warning, on the first CUDA call only.
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.empty(1, 2, 8, 64, device="cuda", dtype=torch.float16)
            torch.ops.flashcore.sdpa(x, x, x)
            torch.ops.flashcore.sdpa(x, x, x)
        assert len(caught) == 1 and "no compiled library" in str(caught[0].message), caught
        print("ok")
    """ % str(no_library), no_library)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def _env_without_nvcc():
    """This environment with every PATH entry holding nvcc removed and CUDACXX unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDACXX", "FLASHCORE_REQUIRE_CUDA")}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.exists(os.path.join(d, "nvcc")))
    return env


@pytest.fixture
def source_copy(tmp_path):
    """What setup.py packages (so its build/ never touches the working tree's)."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), tmp_path / name)
    shutil.copytree(os.path.join(REPO, "python"), tmp_path / "python",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"))
    return tmp_path


def test_require_cuda_without_nvcc_fails_in_one_line(source_copy):
    env = dict(_env_without_nvcc(), FLASHCORE_REQUIRE_CUDA="1")
    r = subprocess.run([sys.executable, "setup.py", "--version"], cwd=source_copy, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "FLASHCORE_REQUIRE_CUDA=1" in lines[0] and "nvcc" in lines[0], r.stderr


def test_build_without_nvcc_makes_a_pure_wheel(source_copy, tmp_path_factory):
    try:  # pip builds here without isolation: the build backend must be importable
        import setuptools.command.bdist_wheel  # noqa: F401
    except ImportError:
        pytest.skip("setuptools >= 70.1 (with bdist_wheel) is not installed")
    # A library left in setuptools' build/lib by an earlier build with CUDA must not ship.
    stale = source_copy / "build" / "lib" / "flashcore"
    stale.mkdir(parents=True)
    (stale / "libflashcore_op.so").write_bytes(b"stale")
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                        "-v", "-w", str(out), "."], cwd=source_copy, env=_env_without_nvcc(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = [line for line in (r.stdout + r.stderr).splitlines() if "nvcc not found" in line]
    assert len(said) == 1, said
    wheels = os.listdir(out)
    assert len(wheels) == 1 and wheels[0].endswith("-py3-none-any.whl"), wheels
    with zipfile.ZipFile(out / wheels[0]) as whl:
        names = whl.namelist()
        assert not [n for n in names if n.endswith(".so")], names
        assert "flashcore/_fallback.py" in names
        assert "HEAD_DIMS = ()" in whl.read("flashcore/_build_config.py").decode()
