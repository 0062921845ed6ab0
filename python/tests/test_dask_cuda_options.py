"""dask-cuda's option names map to the same stack as the equivalent rmm.toml."""

import pytest

import rmm_rs


@pytest.mark.parametrize(
    "options, toml",
    [
        (
            {"rmm_pool_size": "256MiB", "rmm_maximum_pool_size": "1GiB"},
            '[pool]\nenabled = true\ninitial_size = "256MiB"\nmaximum_size = "1GiB"\n',
        ),
        ({"rmm_pool_size": 0.25}, '[pool]\nenabled = true\ninitial_size = "25%"\n'),
        ({"rmm_managed_memory": True}, "[pool]\nmanaged = true\n"),
        (
            {"rmm_pool_size": "128MiB", "rmm_managed_memory": True},
            '[pool]\nenabled = true\nmanaged = true\ninitial_size = "128MiB"\n',
        ),
        ({"rmm_track_allocations": True}, "[tracking]\nenabled = true\n"),
    ],
)
def test_options_map_to_the_same_stack_as_rmm_toml(tmp_path, options, toml):
    path = tmp_path / "rmm.toml"
    path.write_text(toml)
    mapped = rmm_rs.config_from_dask_cuda(**options)
    assert rmm_rs.describe(mapped) == rmm_rs.describe(str(path))


def test_log_directory_turns_logging_on(tmp_path):
    mapped = rmm_rs.config_from_dask_cuda(rmm_log_directory=str(tmp_path))
    assert mapped["logging.enabled"] is True
    rmm_rs.initialize(mapped)
    buf = rmm_rs.DeviceBuffer(1024)
    buf.free()
    rmm_rs.finalize()
    assert (tmp_path / "rmm_log.dev0.csv").exists()


def test_async_with_managed_is_refused_as_in_dask_cuda():
    with pytest.raises(rmm_rs.RmmError, match="cannot be combined"):
        rmm_rs.config_from_dask_cuda(rmm_async=True, rmm_managed_memory=True)
