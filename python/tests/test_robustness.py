"""Hostile input and races: cyclic or deep settings, concurrent initialize."""

import subprocess
import sys
import textwrap
import threading

import pytest

import rmm_rs


def run_python(code):
    """Runs `code` in a fresh interpreter (a crash there fails the test, not the session)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cyclic_and_deep_settings_are_errors_naming_the_key_and_the_limit():
    out = run_python(
        r"""
        import re, sys
        import rmm_rs

        def refused(settings, pattern):
            try:
                rmm_rs.initialize(settings)
            except rmm_rs.RmmError as e:
                assert re.search(pattern, str(e)), str(e)
            else:
                sys.exit("accepted")
            assert not rmm_rs.is_initialized()

        l = []
        l.append(l)
        refused({"devices": l}, r"^setting devices\[0\]: the list contains itself")
        d = {}
        d["pool"] = d
        refused(d, r"^setting pool: the dict contains itself")
        deep = 1
        for _ in range(200_000):
            deep = [deep]
        refused({"devices": deep},
                r"^setting devices(\[0\]){32}: dicts and lists nested deeper than 32 levels")
        nested = {"enabled": True}
        for _ in range(200_000):
            nested = {"pool": nested}
        refused(nested, r"^setting (pool\.){32}pool: dicts and lists nested deeper than 32")
        t = (1,)
        for _ in range(200_000):
            t = (t,)
        refused({"devices": t}, r"nested deeper than 32 levels")
        # The overrides dict and describe() walk the same way.
        try:
            rmm_rs.initialize({}, overrides={"devices": l})
        except rmm_rs.RmmError as e:
            assert "contains itself" in str(e)
        try:
            rmm_rs.describe({"devices": deep})
        except rmm_rs.RmmError as e:
            assert "deeper than 32" in str(e)
        print("ok")
        """
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr)


def test_a_setting_that_is_not_valid_utf8_is_refused_by_name_not_changed_or_a_crash():
    # Lone surrogates: what os.fsdecode makes of undecodable bytes in a path. Such a
    # directory cannot be named in UTF-8 settings; it must be refused, not replaced by
    # another path (U+FFFD) or turned into a panic.
    out = run_python(
        r"""
        import pathlib, sys
        import rmm_rs

        for value in ("/data/\udcff", "\ud800", pathlib.Path("/x/\ud800"), b"/x/\xff"):
            try:
                rmm_rs.initialize({"spill": {"enabled": True, "disk_directory": value}})
            except rmm_rs.RmmError as e:
                assert str(e).startswith("setting spill.disk_directory: "), str(e)
                assert "not valid UTF-8" in str(e), str(e)
            else:
                sys.exit(f"accepted {value!r}")
            assert not rmm_rs.is_initialized()
        print("ok")
        """
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr)


def test_settings_nested_within_the_limit_still_load():
    rmm_rs.initialize({"device": {"0": {"pool": {"initial_size": "16MiB"}}},
                       "pool": {"enabled": True}, "devices": [0]})
    assert rmm_rs.device_statistics()[0]["reserved_bytes"] == 16 << 20


def test_two_threads_initializing_different_devices_start_one_runtime():
    # Two simulated devices; each thread asks for its own, so no device claim can stop
    # the second: only the process-wide check does.
    out = run_python(
        r"""
        import os, threading
        os.environ["RMM_BACKEND"] = "sim"
        os.environ["RMM_SIM_DEVICES"] = "2"
        os.environ["RMM_SIM_MEMORY"] = "1GiB"
        import rmm_rs

        for attempt in range(20):
            barrier = threading.Barrier(2)
            results = []

            def init(device):
                barrier.wait()
                try:
                    rmm_rs.initialize({"devices": [device],
                                       "pool": {"enabled": True, "initial_size": "64MiB"}})
                    results.append(("ok", device))
                except rmm_rs.RmmError as e:
                    results.append(("error", str(e)))

            threads = [threading.Thread(target=init, args=(d,)) for d in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ok = [r for r in results if r[0] == "ok"]
            errors = [r[1] for r in results if r[0] == "error"]
            assert len(ok) == 1, results
            assert len(errors) == 1 and (
                "already initialized" in errors[0] or "another thread" in errors[0]
            ), errors
            assert rmm_rs.devices() == [ok[0][1]], (rmm_rs.devices(), results)
            rmm_rs.finalize()
        print("ok")
        """
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr)


def test_arbitrary_settings_dicts_load_or_raise_rmm_error_never_crash():
    # A fixed budget of seeded random dicts (nested values, odd types, hostile objects whose
    # conversions raise or change the dict), each through validate_config, the overrides
    # dict and describe(): every one loads or raises RmmError, never another exception or a
    # crash, and the whole run stays within its time bound. In a fresh interpreter, so that
    # a crash fails this test instead of the session.
    out = run_python(
        r"""
        import math, os, random, sys, time
        os.environ["RMM_BACKEND"] = "sim"
        import rmm_rs

        KEYS = ["backend", "devices", "workers_per_device", "pool", "pool.enabled",
                "pool.initial_size", "pool.maximum_size", "pool.managed", "pool.async",
                "logging", "logging.enabled", "logging.directory", "limits",
                "limits.device_memory_limit", "spill", "spill.enabled",
                "spill.device_memory_limit", "spill.host_pool_size", "spill.disk_directory",
                "stats.enabled", "tracking.backtraces", "device", "device.0", "device.1.pool",
                "enabled", "initial_size", "0", "x", "", ".", "a.b.c"]

        class Raises:
            def __index__(self): raise ValueError("index")
            def __float__(self): raise ValueError("float")
            def __str__(self): raise ValueError("str")
            def __repr__(self): raise ValueError("repr")
            def __fspath__(self): raise ValueError("fspath")

        class Mutates:
            # Converting it changes the dict being walked.
            def __init__(self, d): self.d = d
            def __index__(self):
                self.d.clear(); self.d["spill"] = {"enabled": True}
                return 1

        class Key(str):
            pass

        def leaf(rng):
            return rng.choice([
                lambda: rng.choice([True, False, None]),
                lambda: rng.randint(-2**70, 2**70),
                lambda: rng.randint(-3, 300),
                lambda: rng.choice([math.nan, math.inf, -math.inf, -0.0, 0.5, 1e300, 2.0]),
                lambda: rng.random(),
                lambda: rng.choice(["auto", "none", "all", "2GiB", "50%", "1e3", "-1",
                                    "0,1", "cuda", "sim", "", "\x00", "\udcff" * 0 + "é"]),
                lambda: "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 8))),
                lambda: bytes(rng.randint(0, 255) for _ in range(3)),
                lambda: rng.choice([object(), Raises(), {1, 2}, 1j, range(3), type]),
            ])()

        def value(rng, depth, top):
            r = rng.random()
            if depth > 0 and r < 0.25:
                return [value(rng, depth - 1, top) for _ in range(rng.randint(0, 4))]
            if depth > 0 and r < 0.35:
                return tuple(value(rng, depth - 1, top) for _ in range(rng.randint(0, 3)))
            if depth > 0 and r < 0.55:
                return settings(rng, depth - 1)
            if r < 0.57:
                return Mutates(top)
            return leaf(rng)

        def settings(rng, depth):
            d = {}
            for _ in range(rng.randint(0, 5)):
                k = rng.choice(KEYS + [rng.randint(0, 3), None, Key("pool"), (1,)])
                d[k] = value(rng, depth, d)
            return d

        rng = random.Random(22)
        start = time.monotonic()
        outcomes = {"ok": 0, "error": 0}
        for i in range(1500):
            d = settings(rng, 4)
            for call in (lambda: rmm_rs.validate_config(d),
                         lambda: rmm_rs.validate_config({}, overrides=d),
                         lambda: rmm_rs.describe(d)):
                try:
                    call()
                    outcomes["ok"] += 1
                except rmm_rs.RmmError as e:
                    assert str(e), "an error with no message"
                    outcomes["error"] += 1
                except BaseException as e:
                    try:
                        shown = repr(d)
                    except BaseException:
                        shown = "(a dict whose repr raises)"
                    sys.exit(f"case {i}: {type(e).__name__}: {e} for {shown}"[:2000])
        elapsed = time.monotonic() - start
        assert elapsed < 60, f"took {elapsed:.1f} s"
        assert outcomes["ok"] > 0 and outcomes["error"] > 0, outcomes
        print("ok", outcomes)
        """
    )
    assert out.returncode == 0 and out.stdout.startswith("ok"), (out.returncode, out.stdout, out.stderr[-3000:])


def test_reinitialize_with_overrides_alone_starts_from_the_running_configuration():
    # Issue 22, item 4: devices "all", 2 workers per device and spilling on; changing only
    # the pool keeps the rest as it runs.
    rmm_rs.initialize({
        "devices": "all",
        "workers_per_device": 2,
        "pool": {"enabled": True, "initial_size": "32MiB"},
        "spill": {"enabled": True, "device_memory_limit": "64MiB", "host_pool_size": "16MiB"},
    })
    devices = rmm_rs.devices()
    workers = len(rmm_rs.report()["workers"])
    assert workers == 2 * len(devices)
    report = rmm_rs.reinitialize(overrides={"pool.enabled": False})
    assert not report["respawned"] and report["notes"] == [], report
    assert rmm_rs.devices() == devices
    assert len(rmm_rs.report()["workers"]) == workers
    assert sorted(rmm_rs.spill_statistics()) == devices
    assert all(s["reserved_bytes"] == 0 for s in rmm_rs.device_statistics().values())
    # A bad change is refused, naming it, and changes nothing.
    with pytest.raises(rmm_rs.RmmError, match="lots"):
        rmm_rs.reinitialize(overrides={"pool": {"enabled": True, "initial_size": "lots"}})
    assert rmm_rs.devices() == devices
    assert len(rmm_rs.report()["workers"]) == workers
    # A config with overrides still means that config, not the running one.
    rmm_rs.reinitialize({"devices": [0]}, overrides={"pool.enabled": False})
    assert rmm_rs.devices() == [0]
    assert len(rmm_rs.report()["workers"]) == 1
