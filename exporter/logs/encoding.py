"""What a log file's bytes are, and what a Windows wrapper added around them. Pure: no I/O.

llama-server writes UTF-8 (on Windows with CRLF line ends: its log file and its stderr are CRT text-mode
streams). What reaches the file depends on who redirects its stderr:

- ``cmd 2> file``, ``Start-Process -RedirectStandardError``, PowerShell 7's ``2>``: the bytes as written
  (UTF-8, CRLF on Windows), sometimes after a UTF-8 byte order mark added by an editor or a copy tool.
- PowerShell 5.1's ``2>``: UTF-16LE with a byte order mark, and the first stderr line wrapped as an
  error record::

      llama-server.exe : build: 11434 (a1b2c3d) with MSVC 19.44.35209.0 for x64
      At line:1 char:1
      + .\\llama-server.exe -m model.gguf 2> llama-server.stderr
      + ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
          + CategoryInfo          : NotSpecified: (build: 11434 (...for x64:String) [], RemoteException
          + FullyQualifiedErrorId : NativeCommandError

  the later lines as written. A wrapper that restarts the server and appends each run's stderr
  (``2>>``) gets such a record around the first line of every run, mid-file.

`sniff` tells the encoding from the first bytes, `Transcoder` turns any of them into UTF-8 across
arbitrary splits (a file is read in pieces), and `PowerShellRecord` takes the record apart again: the
first line without its ``<exe> : `` prefix, the record's own lines dropped. The tailer and ``diagnose``
both use them, so a log reads the same whichever way it was redirected. Both also count a block's lines
with `newlines`.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

__all__ = ["Encoding", "PowerShellRecord", "Transcoder", "cut_utf8", "sniff"]

_BOMS = (
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),  # before UTF-16LE, whose mark begins it
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
)


@dataclass(frozen=True)
class Encoding:
    """A file's encoding: the codec name and the length of its byte order mark (0: none)."""

    name: str
    bom: int = 0

    @property
    def is_utf8(self) -> bool:
        return self.name == "utf-8"

    def describe(self) -> str:
        """In words, for a report: ``UTF-16LE with a byte order mark``."""
        name = self.name.upper().replace("-LE", "LE").replace("-BE", "BE")
        return f"{name} with a byte order mark" if self.bom else name


UTF8 = Encoding("utf-8")


def sniff(head: bytes) -> Encoding | None:
    """The encoding of a file whose content starts with `head`; None when `head` is too short to tell
    (a prefix of a byte order mark, or a possible UTF-16 character): ask again with more bytes.

    Without a byte order mark, text whose every second byte is NUL (ASCII in UTF-16LE) is UTF-16LE;
    anything else is UTF-8 (invalid bytes are replaced when decoded, never an error).
    """
    for bom, name in _BOMS:
        if head.startswith(bom):
            return Encoding(name, len(bom))
        if len(head) < len(bom) and bom.startswith(head):
            return None
    if len(head) < 4:
        return None if len(head) >= 1 and head[1:2] in (b"", b"\0") and head[:1] != b"\0" else UTF8
    if head[0] and not head[1] and head[2] and not head[3]:
        return Encoding("utf-16-le")
    return UTF8


class Transcoder:
    """Bytes in `encoding` to UTF-8 bytes, piece by piece: a character split between two reads is
    decoded once both halves are in. Invalid sequences become U+FFFD."""

    def __init__(self, encoding: Encoding) -> None:
        self._decoder = codecs.getincrementaldecoder(encoding.name)(errors="replace")

    def __call__(self, data: bytes) -> bytes:
        return self._decoder.decode(data).encode("utf-8", "replace")


# The first line of the record: the command as it was run (a drive letter is the only colon it may hold),
# " : ", then the program's line. llama-server's own lines never start with a word followed by " : ".
_RECORD_FIRST = re.compile(r"(?:[A-Za-z]:)?[^:]+? : (?P<line>.*)")
# Where the command ran: "At line:1 char:1" (interactive) or "At C:\\run.ps1:12 char:5" (a script).
_RECORD_AT = re.compile(r"At (?:line:\d+|.+:\d+) char:\d+\s*")
_RECORD_BODY = re.compile(r"\s*\+ ")  # the command, its underline, CategoryInfo, FullyQualifiedErrorId


class PowerShellRecord:
    """Takes PowerShell 5.1's error records off a file's lines (see the module's docstring).

    Fed the file's lines in order, from its first; returns the lines to keep. The first line is held
    until the second says whether it opened a record (``At line:...``): a file whose first line only
    looks like one keeps it as it was. A file that starts without a record has none: then it is `done`
    and the caller may stop feeding it. After a record, every line that starts with the same
    ``<exe> : `` (the next run of a wrapper appending with ``2>>``) is held the same way.
    """

    _FIRST, _HELD, _BODY, _AFTER, _DONE, _WATCH = range(6)

    def __init__(self) -> None:
        self._state = self._FIRST
        self._held = ""
        self.found = False  # a record was taken off
        self.prefix: str | None = None  # the first record's "<exe> : ", which later records start with too

    @property
    def done(self) -> bool:
        return self._state == self._DONE

    @property
    def watching(self) -> bool:
        """Past a record, looking for the next: a line can only open one if it starts with `prefix`."""
        return self._state == self._WATCH

    @property
    def holding(self) -> bool:
        """The first line is held until the next one comes."""
        return self._state == self._HELD

    def feed(self, lines: list[str]) -> list[str]:
        """The lines to keep of `lines` (the next lines of the file)."""
        if self._state == self._DONE:
            return lines
        prefix = self.prefix
        if self._state == self._WATCH and prefix is not None and not any(x.startswith(prefix) for x in lines):
            return lines  # the common case once past a record: no line to look at
        out: list[str] = []
        for i, line in enumerate(lines):
            if self._state == self._DONE:
                out.extend(lines[i:])
                break
            out.extend(self._one(line))
        return out

    def flush(self) -> list[str]:
        """The file ends (or is rewritten): a held first line is a line."""
        held, self._held = self._held, ""
        if self._state == self._HELD:
            self._state = self._DONE if self.prefix is None else self._WATCH
            return [held]
        return []

    def _one(self, line: str) -> list[str]:
        """One line (with or without its line end, kept as it came)."""
        state = self._state
        bare = line.rstrip("\r\n")
        after = self._DONE if self.prefix is None else self._WATCH  # where a line that opens no record leads
        if state == self._FIRST or state == self._WATCH:
            if (self.prefix is None or bare.startswith(self.prefix)) and _RECORD_FIRST.fullmatch(bare):
                self._state, self._held = self._HELD, line
                return []
            self._state = after
            return [line]
        if state == self._HELD:
            held, self._held = self._held, ""
            if _RECORD_AT.fullmatch(bare):
                self._state, self.found = self._BODY, True
                held_bare = held.rstrip("\r\n")
                match = _RECORD_FIRST.fullmatch(held_bare)
                if match is None:
                    return [held]
                self.prefix = held_bare[: match.start("line")]
                return [match.group("line") + held[len(held_bare) :]]
            self._state = after
            return [held, *self._again(line)]
        if state == self._BODY and _RECORD_BODY.match(line):
            if "FullyQualifiedErrorId" in line:
                self._state = self._AFTER
            return []
        if state == self._AFTER and not line.strip():  # the blank line that ends the record
            self._state = self._WATCH
            return []
        self._state = after
        return self._again(line)

    def _again(self, line: str) -> list[str]:
        """A line after one that opened no record, or after a record: it may open a record itself."""
        return [line] if self._state == self._DONE else self._one(line)


def cut_utf8(data: bytes) -> bytes:
    """Drop an incomplete multi-byte UTF-8 sequence at the end of ``data``."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if need > back:
                return data[:-back]
        return data
    return data


#: Newlines in a read's first KiB above which its lines are taken as short (see `newlines`).
_SHORT_LINES = 32


def newlines(data: bytes) -> int:
    """The "\\n" in `data`, counted the cheaper of two ways for its lines' length.

    `bytes.count` looks at every byte, about 0.35 ns each: 29 ns a line of 86 bytes (the bench corpus'
    mean). `bytes.replace` finds each newline with `memchr`: 13 ns such a line, but 10 ns a blank one, which
    the look at every byte passes in 0.4. A read whose first KiB holds more than `_SHORT_LINES` newlines is
    counted byte by byte, so short or blank lines (a client can write them) cost what they would cost
    anyway; short lines after a first KiB of long ones cost at most those 10 ns, against the 160 ns the
    scan spends on a blank line.
    """
    if data.count(b"\n", 0, 1024) > _SHORT_LINES:
        return data.count(b"\n")
    return len(data) - len(data.replace(b"\n", b""))
