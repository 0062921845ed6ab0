"""rmm_rs.__version__: the version the extension was built from, the installed package's
version (the wheel takes the Rust crates' version), and the CLI's (`rmm --version`)."""

import importlib.metadata
import re

import rmm_rs


def test_the_version_is_the_installed_packages():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", rmm_rs.__version__), rmm_rs.__version__
    assert importlib.metadata.version("rmm-rs") == rmm_rs.__version__
    assert "__version__" in rmm_rs.__all__
