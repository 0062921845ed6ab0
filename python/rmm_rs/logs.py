"""RAPIDS RMM's allocation-log functions over rmm-rs's configuration: ``enable_logging``,
``disable_logging`` and ``get_log_filenames``.

rmm-rs logs a device's allocations and frees when its stack has a logging adaptor, which the
configuration puts there (``logging.enabled``, ``logging.directory``, ``logging.file_name``).
These functions change those settings of the running configuration with a reinitialize, so
they refuse, as a reinitialize does, while device buffers are live (free them first, or turn
logging on in the configuration from the start). Device N logs to the file name with
``.devN`` before its extension, as in RMM.
"""

import os
from pathlib import Path
from typing import Dict, Optional, Union

from . import _rmm_rs
from .reinitialize_hooks import reinitialize


def enable_logging(log_file_name: Union[str, "os.PathLike[str]", None] = None) -> None:
    """Logs every allocation and free of every device to ``log_file_name`` (else the
    ``RMM_LOG_FILE`` variable; ``ValueError`` without either), one CSV file per device
    (``mylog.csv`` → ``mylog.dev0.csv``). Starts rmm-rs (its configuration, with logging)
    when it is not running."""
    name = log_file_name if log_file_name is not None else os.environ.get("RMM_LOG_FILE")
    if not name:
        raise ValueError(
            "enable_logging: give log_file_name (or set RMM_LOG_FILE), the file each device's "
            "log is named after"
        )
    path = Path(name)
    settings = {
        "logging.enabled": True,
        "logging.directory": str(path.parent),
        "logging.file_name": path.name,
    }
    if _rmm_rs.is_initialized():
        reinitialize(overrides=settings)
    else:
        _rmm_rs.initialize(None, settings)


def disable_logging() -> None:
    """Stops logging on every device (nothing when rmm-rs is not running or not logging)."""
    if _rmm_rs.is_initialized() and any(get_log_filenames().values()):
        reinitialize(overrides={"logging.enabled": False})


def get_log_filenames() -> Dict[int, Optional[str]]:
    """Per running device, the file its log is written to, or None; empty when rmm-rs is not
    running."""
    if not _rmm_rs.is_initialized():
        return {}
    return dict(_rmm_rs.log_file_names())
