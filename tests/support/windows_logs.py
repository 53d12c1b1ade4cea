"""Windows on Linux, for the log's tests: a log as Windows' wrappers leave it, and the C runtime's text-mode
descriptors that Windows' `os.open` returns without `O_BINARY`.

`variant` writes a real capture the ways it reaches a file on Windows: llama-server's own CRLF (its
`--log-file` and its stderr are CRT text-mode streams), after a UTF-8 byte order mark, as PowerShell 5.1's
`2>` writes it (UTF-16LE with a byte order mark, the first line wrapped as an error record), and as a
PowerShell 5.1 restart loop appends run after run (`2>>`: a record around each run's first line).

`CrtTextMode` makes `os.open`/`os.read` behave as the MSVC C runtime does for the files under one folder:
a descriptor opened without `O_BINARY` is in text mode, and its reads turn CRLF into LF and stop at a ^Z
byte, while `lseek` and `fstat` stay in raw bytes; there is no `os.pread` (Windows has none).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

VARIANTS = ("lf", "crlf", "utf8-bom", "utf16le-bom", "powershell51")

#: The command line PowerShell shows in its error record (any command; the record's shape is what counts).
PS_COMMAND = r".\llama-server.exe -m C:\models\model.gguf -c 262144 2> llama-server.stderr"


def powershell51_record(first: str, exe: str = "llama-server.exe", command: str = PS_COMMAND) -> list[str]:
    """The lines PowerShell 5.1 writes for a native program's first stderr line `first`."""
    shown = first if len(first) <= 30 else first[:14] + "..." + first[-13:]
    return [
        f"{exe} : {first}",
        "At line:1 char:1",
        f"+ {command}",
        "+ " + "~" * len(command),
        f"    + CategoryInfo          : NotSpecified: ({shown}:String) [], RemoteException",
        "    + FullyQualifiedErrorId : NativeCommandError",
        " ",
    ]


def variant(data: bytes, kind: str) -> bytes:
    """A log's bytes (LF line ends, as recorded) the way `kind` (one of VARIANTS) leaves them in a file."""
    if kind == "lf":
        return data
    crlf = data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    if kind == "crlf":
        return crlf
    if kind == "utf8-bom":
        return b"\xef\xbb\xbf" + crlf
    if kind == "utf16le-bom":
        return b"\xff\xfe" + crlf.decode("utf-8", "surrogateescape").encode("utf-16-le", "surrogatepass")
    if kind == "powershell51":
        text = crlf.decode("utf-8")
        first, sep, rest = text.partition("\r\n")
        wrapped = "\r\n".join(powershell51_record(first)) + sep + rest
        return b"\xff\xfe" + wrapped.encode("utf-16-le")
    raise ValueError(kind)


def powershell51_appended(runs: list[bytes]) -> list[bytes]:
    """Each run's stderr (LF, as recorded) as a PowerShell 5.1 restart loop appends it (`2>>`): UTF-16LE,
    a byte order mark at the start of the file only, every run's first line wrapped in an error record.
    The pieces in order: the file is their concatenation."""
    command = PS_COMMAND.replace("2>", "2>>")
    out = []
    for i, run in enumerate(runs):
        first, sep, rest = run.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n").decode("utf-8").partition("\r\n")
        wrapped = "\r\n".join(powershell51_record(first, command=command)) + sep + rest
        out.append((b"\xff\xfe" if i == 0 else b"") + wrapped.encode("utf-16-le"))
    return out


O_TEXT = 0x4000  # the MSVC CRT's values
O_BINARY = 0x8000
CTRL_Z = b"\x1a"


class CrtTextMode:
    """The MSVC C runtime's descriptors, for the files under `root` (see the module's docstring)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = str(root.resolve())
        self.text_fds: set[int] = set()
        self.opened: list[tuple[str, bool]] = []  # (path, text mode) for every open under root
        self._open, self._read, self._close = os.open, os.read, os.close
        monkeypatch.setattr(os, "O_BINARY", O_BINARY, raising=False)
        monkeypatch.setattr(os, "O_TEXT", O_TEXT, raising=False)
        monkeypatch.delattr(os, "pread", raising=False)
        monkeypatch.setattr(os, "open", self.open)
        monkeypatch.setattr(os, "read", self.read)
        monkeypatch.setattr(os, "close", self.close)

    def open(self, path: str | os.PathLike[str], flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        # O_TEXT is O_DIRECT on Linux and O_BINARY is O_LARGEFILE: neither reaches the real open.
        fd = self._open(path, flags & ~(O_TEXT | O_BINARY), mode, dir_fd=dir_fd)
        if os.path.realpath(path).startswith(self.root + os.sep):
            text = not flags & O_BINARY
            self.opened.append((os.fspath(path), text))
            if text:
                self.text_fds.add(fd)
        return fd

    def read(self, fd: int, n: int) -> bytes:
        data = self._read(fd, n)
        if fd not in self.text_fds:
            return data
        # _read in text mode: ^Z ends the data (the file position has moved past all of it), CRLF -> LF.
        cut = data.find(CTRL_Z)
        if cut >= 0:
            data = data[:cut]
        return data.replace(b"\r\n", b"\n")

    def close(self, fd: int) -> None:
        self.text_fds.discard(fd)
        self._close(fd)
