"""RAPIDS RMM's reinitialize hooks: functions that run before each ``rmm_rs.reinitialize``.

A library that keeps device memory of the running stack in a cache registers a hook that lets
go of it, so that the stack a reinitialize replaces can give its memory back. Hooks run in the
reverse order of registration, each with the arguments it was registered with, before the
runtime is touched; a hook that raises stops the reinitialize (the running stacks stay), as
in RMM.
"""

from functools import wraps
from typing import Any, Callable, Dict, List, Tuple, TypeVar, cast

from . import _rmm_rs

_F = TypeVar("_F", bound=Callable[..., Any])

_hooks: List[Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]] = []


def register_reinitialize_hook(
    func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Callable[..., Any]:
    """Runs ``func(*args, **kwargs)`` before every later ``rmm_rs.reinitialize`` (hooks in
    the reverse order of registration); returns ``func``, so that it works as a decorator."""
    if not callable(func):
        raise TypeError(
            f"register_reinitialize_hook({func!r}): expected a function to call before "
            "rmm_rs.reinitialize"
        )
    _hooks.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func: Callable[..., Any]) -> None:
    """Removes every registration of ``func`` (nothing when it has none)."""
    _hooks[:] = [h for h in _hooks if h[0] != func]


def _after_hooks(native: _F) -> _F:
    """``native`` (the runtime's reinitialize), run after the hooks; its signature kept."""

    @wraps(native)
    def call(*args: Any, **kwargs: Any) -> Any:
        for func, hook_args, hook_kwargs in reversed(list(_hooks)):
            func(*hook_args, **hook_kwargs)
        return native(*args, **kwargs)

    return cast(_F, call)


#: ``rmm_rs.reinitialize``: the hooks, then the runtime's reinitialize.
reinitialize = _after_hooks(_rmm_rs.reinitialize)
