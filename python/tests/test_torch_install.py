"""Which functions ``rmm_rs.allocators.torch`` hands PyTorch, with PyTorch replaced by a
recording stand-in (``torch``, ``torch.cuda``, ``torch.cuda.memory`` in ``sys.modules``): no
PyTorch, no GPU. ``install()`` takes the shim ``rmm_rs_torch`` when it imports, else rmm-rs's
own functions with one warning; ``mem_pool()`` keeps rmm-rs's own functions either way."""

import sys
import types
import warnings

import pytest

from rmm_rs import _rmm_rs
from rmm_rs.allocators import torch as rt

SHIM_LIBRARY = "/site/rmm_rs_torch/_shim.so"
SHIM_FUNCTIONS = ("rmm_rs_torch_malloc", "rmm_rs_torch_free")


class FakePluggableAllocator:
    """Records ``CUDAPluggableAllocator(path, alloc_fn_name, free_fn_name)``."""

    def __init__(self, path, alloc_fn_name, free_fn_name):
        self.args = (path, alloc_fn_name, free_fn_name)
        self._allocator = ("allocator", self.args)


class FakeMemPool:
    def __init__(self, allocator):
        self.allocator = allocator


@pytest.fixture
def fake_torch(monkeypatch):
    """A stand-in PyTorch; its ``installed`` list holds what ``change_current_allocator``
    got. The fallback's warning is not yet given."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    installed: list = []
    setattr(memory, "CUDAPluggableAllocator", FakePluggableAllocator)
    setattr(memory, "change_current_allocator", installed.append)
    setattr(cuda, "memory", memory)
    setattr(cuda, "MemPool", FakeMemPool)
    setattr(torch, "cuda", cuda)
    setattr(torch, "installed", installed)
    for name, module in (("torch", torch), ("torch.cuda", cuda), ("torch.cuda.memory", memory)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(rt, "_warned", False)
    return torch


@pytest.fixture
def shim(monkeypatch):
    """A stand-in ``rmm_rs_torch`` with the real one's interface."""
    module = types.ModuleType("rmm_rs_torch")
    setattr(module, "LIBRARY", SHIM_LIBRARY)
    setattr(module, "functions", lambda: SHIM_FUNCTIONS)
    monkeypatch.setitem(sys.modules, "rmm_rs_torch", module)
    return module


@pytest.fixture
def no_shim(monkeypatch):
    """As if rmm_rs_torch were not installed."""
    monkeypatch.setitem(sys.modules, "rmm_rs_torch", None)


def rmm_rs_own():
    return (_rmm_rs.__file__, *_rmm_rs.torch_functions())


def test_install_takes_the_shims_functions_when_it_imports(fake_torch, shim):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        alloc = rt.install()
    assert alloc.args == (SHIM_LIBRARY, *SHIM_FUNCTIONS)
    assert fake_torch.installed == [alloc]
    assert rt.shim_error() is None


def test_without_the_shim_install_takes_rmm_rs_own_functions_and_warns_once(
    fake_torch, no_shim, caplog
):
    with pytest.warns(RuntimeWarning) as record:
        first = rt.install()
        second = rt.install()
    assert first.args == second.args == rmm_rs_own()
    assert fake_torch.installed == [first, second]
    messages = [str(w.message) for w in record if "rmm_rs_torch" in str(w.message)]
    assert len(messages) == 1, messages
    for part in ("address 0", "torch.OutOfMemoryError", "python/torch_bridge", "mem_pool()"):
        assert part in messages[0], (part, messages[0])
    assert [r.getMessage() for r in caplog.records if r.name == "rmm_rs.allocators"] == messages
    assert rt.shim_error() is not None


def test_a_shim_that_does_not_import_is_named_in_the_warning(fake_torch, monkeypatch, tmp_path):
    # A real import failure: a package whose extension would not load against this PyTorch.
    package = tmp_path / "rmm_rs_torch"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('_shim.so: undefined symbol: _ZN3c105ErrorC2E')\n"
    )
    monkeypatch.delitem(sys.modules, "rmm_rs_torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(RuntimeWarning, match="ImportError: _shim.so: undefined symbol"):
        alloc = rt.install()
    assert alloc.args == rmm_rs_own()
    assert rt.shim_error() == "ImportError: _shim.so: undefined symbol: _ZN3c105ErrorC2E"


def test_mem_pool_keeps_rmm_rs_own_functions_with_the_shim(fake_torch, shim):
    # PyTorch's caching allocator checks for null itself (and retries after freeing its
    # cache), so the MemPool must not get the throwing functions.
    pool = rt.mem_pool()
    assert pool.allocator == ("allocator", rmm_rs_own())
    assert fake_torch.installed == []
