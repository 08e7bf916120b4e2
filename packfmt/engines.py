"""Build engines by name: ``build_text(..., engine="ray")`` and ``packfmt build --engine ray``.

``"local"`` is ``pipeline.run_build``, called by ``build`` itself. Any other engine lives above
``build`` (``packfmt.ray`` imports the build's converters and sources, never the other way round),
so ``build`` finds it here by name: ``KNOWN`` says which module registers it, imported on first
use (the way fsspec finds its file systems), and that module calls ``register``. An engine is
``run(inputs, converter, factory, out, *, fmt, split, glob, report_base, **kw) -> BuildResult``.
"""

from __future__ import annotations

import importlib
from typing import Callable

__all__ = ["KNOWN", "register", "engine"]

#: Engine name -> the module that registers it (imported when the engine is first asked for).
KNOWN = {"ray": "packfmt.ray.build"}

_ENGINES: dict[str, Callable] = {}


def register(name: str, run: Callable) -> None:
    """Make ``run`` the engine called ``name``."""
    _ENGINES[name] = run


def engine(name: str) -> Callable:
    """The engine called ``name`` (ValueError naming the engines for an unknown one)."""
    if name not in _ENGINES and name in KNOWN:
        importlib.import_module(KNOWN[name])
    if name not in _ENGINES:
        raise ValueError(f"engine: expected one of {('local', *KNOWN)}, found {name!r}")
    return _ENGINES[name]
