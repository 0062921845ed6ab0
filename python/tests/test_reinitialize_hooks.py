"""RAPIDS RMM's reinitialize hooks (``rmm_rs.register_reinitialize_hook`` /
``unregister_reinitialize_hook``): run before each reinitialize, last registered first, with
their arguments; unregistering removes every registration; a hook that raises stops the
reinitialize and the running stacks stay. The order is checked against RAPIDS RMM's own
hooks where RMM imports (its reinitialize then fails without a GPU, after its hooks ran)."""

from typing import Any, List, Tuple

import pytest

import rmm_rs


@pytest.fixture
def calls():
    made: List[Tuple[str, Any]] = []
    yield made
    for name in ("first", "second", "third"):
        rmm_rs.unregister_reinitialize_hook(_HOOKS[name])


def _hook(name):
    def hook(calls, *args, **kwargs):
        calls.append((name, args, kwargs))

    hook.__name__ = name
    return hook


_HOOKS = {name: _hook(name) for name in ("first", "second", "third")}


def _register(register, calls):
    register(_HOOKS["first"], calls, 1, key="a")
    register(_HOOKS["second"], calls)
    register(_HOOKS["third"], calls, 3)
    register(_HOOKS["first"], calls, 4)


def test_hooks_run_last_registered_first_with_their_arguments(calls):
    rmm_rs.initialize()
    assert rmm_rs.register_reinitialize_hook(_HOOKS["first"], calls, 1, key="a") is _HOOKS["first"]
    rmm_rs.register_reinitialize_hook(_HOOKS["second"], calls)
    rmm_rs.register_reinitialize_hook(_HOOKS["third"], calls, 3)
    rmm_rs.register_reinitialize_hook(_HOOKS["first"], calls, 4)
    rmm_rs.reinitialize()
    assert calls == [
        ("first", (4,), {}),
        ("third", (3,), {}),
        ("second", (), {}),
        ("first", (1,), {"key": "a"}),
    ]
    calls.clear()
    rmm_rs.unregister_reinitialize_hook(_HOOKS["first"])  # both registrations
    rmm_rs.unregister_reinitialize_hook(lambda: None)  # never registered: nothing happens
    rmm_rs.reinitialize()
    assert [c[0] for c in calls] == ["third", "second"]
    rmm_rs.finalize()


def test_a_hook_that_raises_stops_the_reinitialize(calls):
    rmm_rs.initialize(None, {"pool.enabled": False})
    before = rmm_rs.describe()

    def refuse():
        raise RuntimeError("a cache still holds device memory")

    rmm_rs.register_reinitialize_hook(refuse)
    try:
        with pytest.raises(RuntimeError, match="cache still holds"):
            rmm_rs.reinitialize(None, {"pool.enabled": True})
    finally:
        rmm_rs.unregister_reinitialize_hook(refuse)
    assert rmm_rs.describe() == before, "the running stacks stay"
    rmm_rs.finalize()


def test_a_hook_must_be_callable():
    with pytest.raises(TypeError, match="expected a function"):
        rmm_rs.register_reinitialize_hook("not a function")  # type: ignore[arg-type]


def test_the_order_is_rmms(calls):
    rmm = pytest.importorskip("rmm", reason="RAPIDS RMM is not installed")
    theirs: List[Tuple[str, Any]] = []
    _register(rmm.register_reinitialize_hook, theirs)
    try:
        try:
            rmm.reinitialize()
        except Exception:  # noqa: BLE001 - without a GPU RMM fails after its hooks ran
            pass
    finally:
        for hook in _HOOKS.values():
            rmm.unregister_reinitialize_hook(hook)
    assert theirs, "RMM ran no hook"
    rmm_rs.initialize()
    _register(rmm_rs.register_reinitialize_hook, calls)
    rmm_rs.reinitialize()
    rmm_rs.finalize()
    assert calls == theirs
