"""Builds ``rmm_rs_torch._shim``, PyTorch's pluggable-allocator functions over rmm-rs, with
``torch.utils.cpp_extension`` (a C++ extension: no CUDA compiler or headers needed).

It needs, in the build environment (``pip install --no-build-isolation``): PyTorch 2.5 or
later (its headers and ``libc10.so``), setuptools and a C++17 compiler (g++). The extension
links ``libc10.so``, which ``import torch`` loads at run time.
"""

import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:
    sys.exit(
        f"rmm-rs-torch: PyTorch is not importable ({e}): install torch first and build with "
        "pip install --no-build-isolation python/torch_bridge"
    )

extension = CppExtension(
    "rmm_rs_torch._shim",
    sources=["rmm_rs_torch/shim.cpp", "rmm_rs_torch/module.cpp"],
    extra_compile_args=["-O2"],
)

setup(
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension},
    package_data={"rmm_rs_torch": ["*.pyi", "py.typed"]},
)
