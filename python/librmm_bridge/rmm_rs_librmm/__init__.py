"""rmm-rs under RAPIDS RMM: :class:`RmmRsMemoryResource`, a librmm memory resource (a
subclass of ``rmm.mr.DeviceMemoryResource``) whose allocations come from rmm-rs with no
Python on the path. ``rmm_rs.allocators.rmm.install()`` uses it when this package is
installed.
"""

# RMM's package loads librmm.so (and the logger it needs), which the extension links against.
import rmm  # noqa: F401

from ._bridge import RmmRsMemoryResource

__all__ = ["RmmRsMemoryResource"]
