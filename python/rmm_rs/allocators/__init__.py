"""Allocators for other libraries, backed by rmm-rs's C functions (no Python per allocation).

``rmm_rs.allocators.cupy.install()`` and ``rmm_rs.allocators.torch.install()``.
"""
