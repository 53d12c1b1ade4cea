"""What the running event loop can do: selector loops (Linux, macOS, uvloop) wait on file descriptors
(`add_reader`); Windows' default proactor loop cannot, nor read an anonymous pipe it did not open.

The exporter asks instead of guessing from the platform, so that the suite's portable configuration (a
loop that refuses as the proactor loop does) runs the same code as Windows.
"""

from __future__ import annotations

import asyncio
import socket
import weakref

_known: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, bool] = weakref.WeakKeyDictionary()


def waits_on_descriptors(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop` can wait on a file descriptor (`add_reader`), found by trying once per loop."""
    known = _known.get(loop)
    if known is None:
        a, b = socket.socketpair()
        try:
            loop.add_reader(a.fileno(), lambda: None)
        except NotImplementedError:
            known = False
        else:
            loop.remove_reader(a.fileno())
            known = True
        finally:
            a.close()
            b.close()
        _known[loop] = known
    return known
