"""Builds the ``rmm_rs_librmm._bridge`` extension over the installed RMM wheels' headers.

It needs, in the build environment (``pip install --no-build-isolation``): RAPIDS RMM's
wheels (``rmm-cu13`` with ``librmm-cu13``, or the ``-cu12`` pair: their headers, the CCCL
headers they ship, and the ``.pxd`` files), CUDA's runtime headers (``cuda_runtime_api.h``:
the toolkit's, found through ``CUDA_HOME``/``CUDA_PATH`` or ``/usr/local/cuda``, else the
``nvidia-cuda-runtime`` and ``nvidia-cuda-crt`` wheels'), Cython 3 and a C++20 compiler
(g++ 11 or later). The extension links ``librmm.so``, which ``import rmm`` loads at run time.
"""

import glob
import os
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup


def fail(message):
    sys.exit(f"rmm-rs-librmm: {message}")


def librmm_dirs():
    try:
        import librmm
    except ImportError:
        fail(
            "librmm is not importable: install RAPIDS RMM's wheels first (pip install "
            "rmm-cu13, or rmm-cu12) and build with --no-build-isolation"
        )
    root = os.path.dirname(librmm.__file__)
    include = os.path.join(root, "include")
    lib = os.path.join(root, "lib64")
    if not os.path.isfile(os.path.join(include, "rmm", "resource_ref.hpp")):
        fail(f"librmm at {root} has no include/rmm/resource_ref.hpp (RMM 26.x is needed)")
    if not os.path.isfile(os.path.join(lib, "librmm.so")):
        fail(f"librmm at {root} has no lib64/librmm.so")
    # CCCL (<cuda/memory_resource>, <cuda/stream>) ships under include/rapids; RMM's headers
    # include rapids_logger's.
    includes = [include, os.path.join(include, "rapids")]
    try:
        import rapids_logger

        includes.append(os.path.join(os.path.dirname(rapids_logger.__file__), "include"))
    except ImportError:
        pass  # a system installation of rapids-logger, on the compiler's own path
    return includes, lib


def cuda_include():
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    candidates.append("/usr/local/cuda/include")
    for path in sys.path:
        candidates += sorted(glob.glob(os.path.join(path, "nvidia", "cu1*", "include")))
        candidates.append(os.path.join(path, "nvidia", "cuda_runtime", "include"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "cuda_runtime_api.h")):
            return c
    fail(
        "cuda_runtime_api.h not found (looked in " + ", ".join(candidates[:4]) + ", and the "
        "nvidia-cuda-runtime wheel): set CUDA_HOME to the CUDA toolkit, or pip install "
        "nvidia-cuda-runtime"
    )


includes, libdir = librmm_dirs()
# RMM's Python extensions use CPython's limited API (abi3): their types are heap types, whose
# instances hold a reference to their type. A subclass must be a heap type too (a static type
# would lose a reference at every instance's deallocation), so this extension is built for
# the limited API as well, as an abi3 wheel for Python 3.11 and later (what RMM's wheels need).
LIMITED_API = 0x030B0000
extension = Extension(
    "rmm_rs_librmm._bridge",
    sources=["rmm_rs_librmm/_bridge.pyx"],
    language="c++",
    include_dirs=["rmm_rs_librmm", *includes, cuda_include()],
    library_dirs=[libdir],
    libraries=["rmm"],
    extra_compile_args=["-std=c++20", "-O2", "-Wno-deprecated-declarations"],
    define_macros=[("Py_LIMITED_API", hex(LIMITED_API))],
    py_limited_api=True,
)

setup(
    ext_modules=cythonize([extension], language_level=3, compiler_directives={"binding": True}),
    package_data={"rmm_rs_librmm": ["*.pyi", "py.typed", "*.hpp"]},
    # The generated C++ and the Cython source are not part of the installed package.
    exclude_package_data={"rmm_rs_librmm": ["*.cpp", "*.pyx"]},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
