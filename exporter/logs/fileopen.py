"""Opening a log file for reading, the same on every system: binary, and on Windows without locking it.

On Windows ``os.open`` without ``os.O_BINARY`` returns a C runtime *text-mode* descriptor: reads turn
CRLF into LF and stop at a ``^Z`` byte, while the file offsets stay in raw bytes, so a reader that
counts what it read gets every offset wrong. And neither ``open`` nor ``os.open`` shares delete access:
while the exporter holds ``llama-server.stderr``, the wrapper that restarts llama-server could not
rename or delete it. So on Windows the file is opened with ``CreateFileW`` (read, sharing read, write
and delete) and the handle turned into a binary descriptor with ``msvcrt.open_osfhandle``; elsewhere
with ``os.open`` (``O_BINARY`` where it exists, ``O_NONBLOCK`` so that a FIFO swapped in cannot block).

Everything here but the two Windows calls (`_create_file_w`, `_open_osfhandle`) runs on every system,
so that the tests run the code Windows runs.
"""

from __future__ import annotations

import errno
import os
import pathlib
import sys
from collections.abc import Callable

__all__ = ["identity", "open_log", "open_shared"]

GENERIC_READ = 0x80000000
FILE_SHARE_READ, FILE_SHARE_WRITE, FILE_SHARE_DELETE = 0x1, 0x2, 0x4
SHARE_ALL = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE
OPEN_EXISTING = 3
FILE_ATTRIBUTE_NORMAL = 0x80
INVALID_HANDLE_VALUE = -1

# Windows error codes (winerror.h) and the errno that Python's own open() maps them to.
_WINERRORS = {
    2: (errno.ENOENT, "The system cannot find the file specified"),  # ERROR_FILE_NOT_FOUND
    3: (errno.ENOENT, "The system cannot find the path specified"),  # ERROR_PATH_NOT_FOUND
    5: (errno.EACCES, "Access is denied"),  # ERROR_ACCESS_DENIED
    32: (errno.EACCES, "The file is being used by another process"),  # ERROR_SHARING_VIOLATION
    123: (errno.EINVAL, "The file name is not valid"),  # ERROR_INVALID_NAME
}

#: CreateFileW(path, access, share, disposition, flags) -> (handle, GetLastError())
CreateFile = Callable[[str, int, int, int, int], "tuple[int, int]"]
#: msvcrt.open_osfhandle(handle, flags) -> fd
OpenOsfHandle = Callable[[int, int], int]
#: CloseHandle(handle)
CloseHandle = Callable[[int], object]


def open_log(path: str | os.PathLike[str]) -> int:
    """A binary, read-only descriptor for `path`; on Windows one that lets others rename or delete it.

    Raises OSError (FileNotFoundError, PermissionError, ...) as ``os.open`` does.
    """
    if sys.platform == "win32":
        return open_shared(os.fspath(path), _create_file_w, _open_osfhandle, _close_handle)
    return os.open(path, os.O_RDONLY | _o_binary() | getattr(os, "O_NONBLOCK", 0))


def _o_binary() -> int:
    """os.O_BINARY (Windows only), looked up when a file is opened (the tests emulate Windows' C runtime)."""
    return int(getattr(os, "O_BINARY", 0))


def open_shared(path: str, create_file: CreateFile, open_osfhandle: OpenOsfHandle, close_handle: CloseHandle) -> int:
    """Windows' open: CreateFileW sharing read, write and delete, then a binary C runtime descriptor."""
    handle, winerror = create_file(path, GENERIC_READ, SHARE_ALL, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL)
    if handle == INVALID_HANDLE_VALUE:
        code, message = _WINERRORS.get(winerror, (errno.EIO, f"Windows error {winerror}"))
        raise OSError(code, message, path)
    try:
        return open_osfhandle(handle, os.O_RDONLY | _o_binary())
    except BaseException:
        close_handle(handle)  # the descriptor owns the handle only once it exists
        raise


if sys.platform == "win32":  # the only code that needs Windows
    import ctypes
    import msvcrt
    from ctypes import wintypes

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _CreateFileW = _kernel32.CreateFileW
    _CreateFileW.argtypes = [
        wintypes.LPCWSTR,
        wintypes.DWORD,
        wintypes.DWORD,
        ctypes.c_void_p,
        wintypes.DWORD,
        wintypes.DWORD,
        wintypes.HANDLE,
    ]
    _CreateFileW.restype = ctypes.c_ssize_t  # a HANDLE, signed so that INVALID_HANDLE_VALUE is -1
    _kernel32.CloseHandle.argtypes = [wintypes.HANDLE]

    def _create_file_w(path: str, access: int, share: int, disposition: int, flags: int) -> tuple[int, int]:
        handle = _CreateFileW(path, access, share, None, disposition, flags, None)
        return int(handle), ctypes.get_last_error()

    def _open_osfhandle(handle: int, flags: int) -> int:
        return msvcrt.open_osfhandle(handle, flags)

    def _close_handle(handle: int) -> object:
        return _kernel32.CloseHandle(handle)

else:

    def _create_file_w(path: str, access: int, share: int, disposition: int, flags: int) -> tuple[int, int]:
        raise OSError(errno.ENOSYS, "CreateFileW exists only on Windows", path)

    def _open_osfhandle(handle: int, flags: int) -> int:
        raise OSError(errno.ENOSYS, "msvcrt.open_osfhandle exists only on Windows")

    def _close_handle(handle: int) -> object:
        return None


def identity(path: pathlib.Path, before: os.stat_result, opened: os.stat_result) -> tuple[int, int]:
    """The (st_dev, st_ino) that stat(path) will show while the path names the file opened (`opened`: its
    fstat; `before`: stat(path) before the open): the path's view if it did not change while the file was
    opened (overlayfs before Linux 4.19 gave fstat another file's, and comparing the two would see a
    rotation at every poll)."""
    try:
        after = path.stat()
    except OSError:
        return (opened.st_dev, opened.st_ino)
    if (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino):
        return (after.st_dev, after.st_ino)
    return (opened.st_dev, opened.st_ino)  # rotated while it was opened: the descriptor's view is the truth
