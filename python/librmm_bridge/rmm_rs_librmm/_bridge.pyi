from typing import Optional, Tuple

from rmm.mr import DeviceMemoryResource

class RmmRsMemoryResource(DeviceMemoryResource):
    """A librmm memory resource that allocates from rmm-rs (see the module)."""

    @property
    def device(self) -> int: ...
    @property
    def functions(self) -> Tuple[int, int, int]: ...
    def __init__(
        self, device: int = 0, functions: Optional[Tuple[int, int, int]] = None
    ) -> None: ...
