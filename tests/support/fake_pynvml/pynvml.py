"""``pynvml`` for an exporter process on a machine without a GPU: the tests' ``FakeNvml``
(``tests/support/fake_nvml.py``) serving the GPUs in ``$FAKE_PYNVML_GPUS``, with nvidia-ml-py's own error
classes and codes. ``fake_nvml.pynvml_env`` puts this folder first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_SUPPORT = str(_HERE.parent)

# Import the real nvidia-ml-py (for its error classes, which FakeNvml raises) and fake_nvml with it:
# for that moment this module steps out of sys.modules and this folder out of sys.path.
_this = sys.modules.pop(__name__)
_path = list(sys.path)
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _HERE] + [_SUPPORT]
try:
    import fake_nvml
    import pynvml as _real
finally:
    sys.path[:] = _path
    sys.modules[__name__] = _this

_fake = fake_nvml.FakeNvml.from_json(os.environ.get(fake_nvml.GPUS_ENV, "[]"))


def __getattr__(name: str) -> Any:
    """The library's functions are the fake's; everything else (errors, constants) is nvidia-ml-py's."""
    return getattr(_fake if name.startswith("nvml") else _real, name)
