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


def test_settings_nested_within_the_limit_still_load():
    rmm_rs.initialize({"device": {"0": {"pool": {"initial_size": "16MiB"}}},
                       "pool": {"enabled": True}, "devices": [0]})
    assert rmm_rs.statistics()[0]["reserved_bytes"] == 16 << 20


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
