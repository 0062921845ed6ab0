"""rmm_rs.allocators.torch's figures under torch.cuda's names (memory_stats,
memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
reset_peak_memory_stats), for a training script on the process-wide route, where PyTorch's
own figures see nothing. They need no PyTorch: rmm-rs's pool on the simulated device."""

import pytest

import rmm_rs
from rmm_rs.allocators import torch as rt

MIB = 1 << 20


def pool_runtime(initial="64MiB", max_overhead="none", growth="1GiB"):
    rmm_rs.initialize(None, {"devices": [0], "pool": {
        "enabled": True, "initial_size": initial, "max_overhead": max_overhead,
        "growth": growth}})


def train(steps=30):
    """A training loop's allocations with a new sequence length every step (GPT-2's shapes,
    scaled down to fit the simulated device): activations made forward, then for each, newest
    first, a gradient of its size made and both freed."""
    state = [rmm_rs.DeviceBuffer(8 * MIB) for _ in range(4)]
    x = 12345
    for _ in range(steps):
        x = (x * 1103515245 + 12345) % (1 << 31)
        length = 64 + x % 961
        sizes = [length * 768 * 8, length * 3072 * 8, 48 * length * length] * 4
        sizes.append(length * 50257 * 2)
        acts = [rmm_rs.DeviceBuffer(n) for n in sizes]
        while acts:
            grad = rmm_rs.DeviceBuffer(acts[-1].size)
            acts.pop()
            del grad
    del state


@pytest.mark.parametrize("max_overhead", ["none", "5%"])
def test_a_loop_of_changing_sizes_reserves_within_max_overhead_of_its_peak(max_overhead):
    # pool.max_overhead is what a training loop whose sizes change every step needs: without
    # it the pool keeps what it grew to, past the bound (the loop shows what the limit is for).
    pool_runtime(initial="16MiB", max_overhead=max_overhead, growth="16MiB")
    rt.reset_peak_memory_stats()
    train()
    peak, reserved = rt.max_memory_allocated(), rt.max_memory_reserved()
    bound = peak * 1.05 + 18 * MIB
    pool = rmm_rs.device_statistics()[0]["pool"]
    assert pool["peak_reserved_bytes"] == reserved
    stats = rt.memory_stats()
    # Chunks taken from the device and given back: PyTorch's segment calls.
    assert stats["num_device_alloc"] > 0
    assert (stats["num_device_free"] > 0) == (max_overhead != "none"), stats
    if max_overhead == "none":
        assert reserved > bound, (reserved, peak)
        assert pool["max_overhead"] is None
    else:
        assert reserved <= bound, (reserved / peak, reserved, peak)
        assert pool["max_overhead"] == 0.05


def test_allocated_and_reserved_follow_the_allocations_and_their_peaks_reset():
    pool_runtime()
    base = rt.memory_allocated()
    a = rmm_rs.DeviceBuffer(32 * MIB)
    b = rmm_rs.DeviceBuffer(16 * MIB)
    assert rt.memory_allocated() == base + 48 * MIB
    assert rt.max_memory_allocated() >= base + 48 * MIB
    # 64 MiB of pool to start with; 48 MiB more in use than that makes it grow.
    c = rmm_rs.DeviceBuffer(64 * MIB)
    grown = rt.memory_reserved()
    assert grown > 64 * MIB
    assert rt.max_memory_reserved() == grown
    del c
    peak = rt.max_memory_allocated()
    assert peak >= base + 112 * MIB
    assert rt.memory_allocated() == base + 48 * MIB
    stats = rt.memory_stats()
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "allocation.all.current",
        "num_ooms",
        "num_device_alloc",
        "num_device_free",
    ):
        assert key in stats, (key, sorted(stats))
    assert stats["allocation.all.current"] >= 2
    # A reset makes every peak the value now.
    rt.reset_peak_memory_stats()
    assert rt.max_memory_allocated() == rt.memory_allocated() == base + 48 * MIB
    assert rt.max_memory_reserved() == rt.memory_reserved()
    d = rmm_rs.DeviceBuffer(8 * MIB)
    assert rt.max_memory_allocated() == base + 56 * MIB
    del a, b, d


def test_the_peak_is_reset_for_the_counter_scope_in_use_too():
    pool_runtime()
    import rmm_rs.statistics as st

    st.push_statistics()
    a = rmm_rs.DeviceBuffer(8 * MIB)
    del a
    before = st.get_statistics()
    assert before is not None and before.peak_bytes == 8 * MIB
    rt.reset_peak_memory_stats()
    after = st.get_statistics()
    assert after is not None and after.peak_bytes == after.current_bytes == 0
    st.pop_statistics()


@pytest.mark.parametrize("device", [None, 0, "cuda", "cuda:0"])
def test_devices_are_named_as_pytorch_names_them(device):
    pool_runtime()
    assert rt.memory_stats(device)["allocated_bytes.all.current"] >= 0


@pytest.mark.parametrize("device", [1.5, "cpu", "cuda:x"])
def test_a_device_named_otherwise_is_refused_by_name(device):
    pool_runtime()
    with pytest.raises(TypeError, match=f"device {device!r}"):
        rt.memory_stats(device)


def test_without_a_pool_there_is_nothing_reserved():
    rmm_rs.initialize(None, {"devices": [0], "pool": {"enabled": False}})
    a = rmm_rs.DeviceBuffer(MIB)
    assert rt.memory_allocated() >= MIB
    assert rt.memory_reserved() == 0 and rt.max_memory_reserved() == 0
    del a
