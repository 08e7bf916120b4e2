"""Running a benchmark script's ``main`` inside a test (its smoke size): ``benchmarks/`` on the import path, the
environment it needs, and every benchmark module it imported dropped again afterwards, so the next test imports
them fresh (a module keeps state: RESULTS_DIR, patched sys.path)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_benchmark(monkeypatch, name: str, argv: list, env: dict | None = None):
    """``(main(argv)'s return value, the module)`` of ``benchmarks/<name>.py``; ``env``: variables set for the call."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, str(value))
    before = set(sys.modules)
    try:
        module = importlib.import_module(name)
        return module.main([str(a) for a in argv]), module
    finally:
        for mod in set(sys.modules) - before:
            if str(getattr(sys.modules[mod], "__file__", "") or "").startswith(str(BENCHMARKS)):
                sys.modules.pop(mod, None)
