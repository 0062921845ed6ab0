"""rmm_rs.__version__ (the version the extension was built from: the Rust crates', which the
wheel takes too; `rmm --version` is checked in cli/tests/cli_info.rs), and RMM's name for the
error class."""

import importlib.metadata
import re

import pytest

import rmm_rs


def test_the_version_is_the_installed_packages():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", rmm_rs.__version__), rmm_rs.__version__
    assert importlib.metadata.version("rmm-rs") == rmm_rs.__version__
    assert "__version__" in rmm_rs.__all__


def test_rmms_name_for_the_error_is_the_same_class():
    assert rmm_rs.RMMError is rmm_rs.RmmError
    assert issubclass(rmm_rs.OutOfMemoryError, rmm_rs.RMMError)
    with pytest.raises(rmm_rs.RMMError, match="pool"):
        rmm_rs.initialize(None, {"pool": {"initial_size": "not a size"}})
