"""Python imports this at start-up when tests/support/portable is on PYTHONPATH (scripts/test.sh's portable
pass): it takes away what Windows' CPython lacks (see ../portable_loop.py)."""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "portable_loop", Path(__file__).resolve().parent.parent / "portable_loop.py"
)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
sys.modules["portable_loop"] = _module
_spec.loader.exec_module(_module)
_module.take_away()
