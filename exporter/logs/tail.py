"""Follow llama-server's ``--log-file`` by path, across rotation, truncation and re-creation.

Modelled on google/mtail's ``fileStream``: a synchronous core (``LogTailer.poll``) that makes every
decision, and a thin async driver (``follow``) that only decides *when* to call it. This docstring
describes the file-level semantics first, because they are the whole point of the module.

Reading model
-------------
This is a "read from the beginning" tailer: a file is always read from offset 0 when it is first
opened, and after every rotation or truncation. Offsets are not persisted, so an exporter restart
re-reads the current file from the start; that is what the consumer wants, because llama-server's
log is rewritten on every server start, so the file describes exactly one server run.

We hold one file descriptor and track our own ``offset`` into it. A poll does, in order:

1. If no file is open: open the path (failure is not an exception; it sets ``last_error``).
2. ``fstat`` the open fd and check it was not truncated or rewritten in place (see below).
3. Read up to the byte budget, splitting complete lines out of the bytes.
4. Only when the fd is at EOF: ``stat`` the *path* and compare ``(st_dev, st_ino)`` with the open
   fd. If the path now names a different file, read the old fd to EOF once more (the writer may
   have appended between step 3 and the rename), keep it as a *rotated* file and continue with the
   new file from offset 0 in the same poll (at most one switch per poll, so a path that never
   matches its fd cannot hang a poll). Every poll starts by reading the rotated files to their end.

Rename-and-create rotation (logrotate's default, ``mv log log.1 && touch log``)
    The renamed file keeps its inode, so our fd keeps reading it. Once at EOF, ``stat(path)`` shows
    a new inode: drain, switch, ``stats.rotations += 1``. The writer may not know: llama-server
    never reopens its log, so after a rename it goes on writing into the renamed file (and its
    partial line is completed there). So the old file stays open as a rotated file and is read to
    its end on every poll; it is closed once it has been quiet for ``rotate_wait`` seconds while the
    current file was written after it (a new writer took over), or when more than ``max_rotated``
    are held (the oldest, read to its end first). No line is lost or repeated. If the path was
    rotated *twice* between two polls, the middle file was never opened and is lost; nothing can be
    done about a file we never saw, so the driver polls on every filesystem event and at least
    every second. A rotated file that comes back to the path is taken up where it was.

Truncation (same inode, smaller than our offset or than a look saw it)
    This is *normal* for llama-server: it opens ``--log-file`` with ``fopen(path, "w")`` (O_TRUNC)
    on every start. We emit the pending partial line, seek to 0 and count ``stats.truncations``.
    If some earlier ``fstat`` (a previous poll, ``has_pending`` or ``probe``) showed the file larger
    than our offset, the difference is bytes we provably never read: added to ``stats.lost_bytes``.
    Such a look also keeps the fingerprints of the size it saw, so that a content read in part or not
    at all (found empty just after a restart) is still told from the content that replaces it.
    A look that finds the content replaced keeps the new content's size apart (``exporter.logs.replaced``):
    a run replaced in turn before we read it counts its truncation and its bytes. What a server wrote
    after the last look is estimated from its rate, if the looks saw it still writing (``Growth``).

In-place rewrite (same inode, already grown past our offset)
    A server that restarted and wrote more than we had read before we polled again: the size check
    sees nothing wrong. So we keep two fingerprints of what we read, the first up-to-64 bytes ("head")
    and the last up-to-64 bytes before our offset ("tail"), re-read on every poll (two small preads).
    If either differs, the file was rewritten: handled as a truncation. The tail check matters for
    llama-server: its first lines (build info, system info) are the same from run to run. A new run
    byte-identical to the old one beyond the largest size any look saw cannot be told from growth (no
    file state shows it): its bytes up to our offset are not read, and not counted.

Delete (path gone, fd still open)
    The inode stays alive while we hold it, so we keep reading it to EOF (a server whose log was
    ``rm``-ed keeps writing into it, and we keep following). ``stat(path)`` fails, we keep waiting.
    When the path reappears as a different file we switch to it from offset 0 and count a rotation;
    the deleted file is kept as a rotated file, like a renamed one.
    Inode numbers are often reused right after a delete (tmpfs, ext4); as we hold the old inode open,
    the new file cannot get its number (and the fingerprints would catch a reuse). A path that comes
    back as the *same* inode (``mv log x && mv x log``) is not a rotation.

copytruncate (``cp log log.1 && truncate -s0 log``)
    Lossy by nature: whatever was appended after our last read and before the truncate is only in
    the copy. We detect the truncation (``stats.truncations``) and lose exactly that window.
    llama-server does not open its log with O_APPEND, so after copytruncate its next write lands at
    its old offset and the file starts with a hole of NUL bytes, which the size check cannot see
    (the file is not smaller) but the fingerprints do. NUL bytes at the very start of a file (after
    open, rotation or truncation) are skipped, so the hole does not become a giant garbage line,
    and the hole measures the loss: it ends where the writer was at the truncation, so
    ``stats.lost_bytes`` gets the hole's length less our offset then, to the byte. A writer with
    O_APPEND leaves no hole; then only the part a ``stat`` had already shown us is counted (the
    rest is not knowable). Prefer rename-and-create rotation (or no rotation: the file is rewritten
    at every server start anyway).

Partial lines
    Bytes after the last ``"\\n"`` are buffered until the rest arrives, so a line written in pieces
    (even inside a UTF-8 character: lines are decoded whole) is returned once. On rotation or
    truncation a buffered partial line is a line: the file it belonged to will never complete it.

Very long lines
    A line longer than ``max_line_bytes`` (with a trailing ``"\\r"``, without ``"\\n"``) is returned
    cut there (at a UTF-8 character boundary), ``stats.long_lines += 1``; the rest up to the next
    ``"\\n"`` is dropped. Memory is bounded by ``max_line_bytes + chunk_bytes``.

Encoding
    Files are read in binary (``exporter.logs.fileopen``: no text-mode CRLF or ``^Z``). The first bytes
    of each content tell its encoding (``exporter.logs.encoding``): UTF-8, with or without a byte order
    mark, or UTF-16 (PowerShell 5.1's ``2>``), turned into UTF-8 before lines are split (offsets and
    counts stay in the file's bytes); PowerShell 5.1's error records are taken off. Lines are decoded
    as UTF-8 with ``errors="replace"``, a trailing ``"\\r"`` stripped. Binary data (``recognize``) is
    not split into lines but said in ``unreadable``: the exporter shows the log as down, not "up".

File missing at start, unreadable, not a regular file
    ``poll`` returns ``[]`` and ``last_error`` says why; the next poll tries again. A directory, FIFO
    or device is refused unopened (opening a FIFO could block or wake its writer). Symlinks are
    followed: identity is the target's, so re-pointing the link is a rotation.

Following the file as it changes (filesystem events, a timer, batching) is ``exporter.logs.follow``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.logs import recognize
from exporter.logs.batch import LineBatch
from exporter.logs.encoding import PowerShellRecord, Transcoder, cut_utf8, newlines, sniff
from exporter.logs.fileopen import identity, open_log
from exporter.logs.replaced import FINGERPRINT_BYTES, Growth, Replacements, Seen
from exporter.logs.replaced import pread as _pread
from exporter.logs.source import SourceStats

__all__ = ["LogTailer", "TailerStats"]

_HEAD_BYTES = _TAIL_BYTES = FINGERPRINT_BYTES


@dataclass
class TailerStats(SourceStats):
    """Counters for one ``LogTailer``, all monotonic: the line source's stats (truncations, rotations, lost
    bytes, long lines: `exporter.logs.source.SourceStats`), and what it read."""

    lines: int = 0  # complete lines returned
    bytes: int = 0  # bytes consumed
    opens: int = 0


def _decode(line: bytes | bytearray) -> str:
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.decode("utf-8", errors="replace")


class _File:
    """One open file and how far it was read: offset, fingerprints, the partial line at its end."""

    def __init__(self, fd: int, ident: tuple[int, int]) -> None:
        self.fd = fd
        self.ident = ident  # (st_dev, st_ino), as stat(path) showed it while the path named this file
        self.offset = 0
        self.head = b""  # first bytes of the file, as we read them
        self.tail = b""  # last bytes before offset, as we read them
        self.seen = Seen()  # the current content as the looks saw it: its largest size, its fingerprints
        self.partial = bytearray()
        self.discarding = False  # inside an over-long line, dropping bytes up to the next "\n"
        self.skip_nul = True  # at the start of the content: skip a copytruncate hole
        self.truncated_at: int | None = None  # our offset when the content was last truncated
        self.lost_counted = 0  # of the bytes lost at that truncation, those already counted
        self.guess = 0  # ...and those estimated (`replaced.Growth`), if no hole measures them
        self.grown_at = 0.0  # when a read last found new bytes (time.monotonic; 0: never)
        self.replaced = Replacements()  # what probes saw replace the content since it was last read
        self.growth = Growth()  # its sizes at the last looks
        self._new_content()

    def _new_content(self) -> None:
        self.undecided = b""  # the first bytes, while too few to tell the encoding (at most 3)
        self.sniffed = False  # the encoding is known
        self.transcode: Transcoder | None = None  # UTF-16 to UTF-8; None: the bytes are UTF-8
        self.record: PowerShellRecord | None = PowerShellRecord()  # None: the content starts with no record
        self.unreadable: str | None = None

    def reset(self) -> None:
        """The content starts again at offset 0 (truncated or rewritten)."""
        self.offset = 0
        self.head = self.tail = b""
        self.seen = Seen()
        self.skip_nul = True
        self.growth = Growth()
        self._new_content()


class LogTailer:
    """Follow one file by path. Synchronous core: all decisions happen in poll(); no threads, no sleeps."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_line_bytes: int = 1 << 20,
        # 128 KiB (~1,400 lines, 2-3 ms to parse): the follower yields between reads. Each read and batch has fixed
        # costs (a fstat, fingerprint preads, the pipeline's): 6.7 % less CPU a line than 32 KiB (bench/cpu_paired.py);
        # scrapes in a 200,000 lines/s flood waited p50 12-14, p99 22 ms against 5 and 12-23 (bench/run.py).
        chunk_bytes: int = 1 << 17,
        rotate_wait: float = 60.0,
        max_rotated: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_line_bytes < 1 or chunk_bytes < 1:
            raise ValueError("max_line_bytes and chunk_bytes must be positive")
        self.path = pathlib.Path(path)
        self.stats = TailerStats()
        self._max_line = max_line_bytes
        self._chunk = chunk_bytes
        self._rotate_wait = rotate_wait
        self._max_rotated = max(0, max_rotated)
        self._clock = clock
        self._file: _File | None = None
        self._rotated: list[_File] = []  # files the path named before, oldest first: still read to their end
        self._error: str | None = None
        self._at_eof = False

    @property
    def is_open(self) -> bool:
        """A file is currently open."""
        return self._file is not None

    @property
    def last_error(self) -> str | None:
        """One-line description of the last open/read problem; None when the last poll was fine."""
        return self._error

    @property
    def at_eof(self) -> bool:
        """The last poll read every file to its end and found the path still naming the current one."""
        return self._at_eof

    @property
    def rotated_files(self) -> int:
        """Rotated files still held open and read, because their writer may still append to them."""
        return len(self._rotated)

    def poll(self, max_bytes: int | None = None) -> list[str]:
        """Return the complete lines that are new since the last poll (reads at most ~max_bytes)."""
        return self.read(max_bytes).lines()

    def read(self, max_bytes: int | None = None) -> LineBatch:
        """`poll`'s lines as a batch: held as the text the parser scans (lines split out only if asked for)."""
        budget = self._chunk if max_bytes is None else max(1, max_bytes)
        out = LineBatch()
        self._at_eof = False
        used, rotated_eof = self._read_rotated(budget, out)
        budget = max(1, budget - used)
        if self._file is None:
            if not self._open():
                self.stats.lines += len(out)
                return out
        else:
            self._error = None
        f = self._file
        assert f is not None
        try:
            self._check_rewritten(f, out)
            n, eof = self._read(f, budget, out)
            budget -= n
            if eof and self._path_replaced(f):
                # Catch writes that landed in the old file between our EOF and the rename.
                n, eof = self._read(f, budget, out)
                budget -= n
                # If the budget ran out, switch on a later poll, still from the old file's EOF.
                # At most one switch per poll: a path that never matches its fd must not hang us.
                if eof:
                    self._retire(f, out)
                    self.stats.rotations += 1
                    if self._open() and self._file is not None:
                        self._read(self._file, budget, out)
            else:
                self._at_eof = eof and rotated_eof
        except OSError as exc:
            # Keep the fd and our offset: a transient EIO/ESTALE should not make us re-read from 0.
            self._error = f"cannot read log file {self.path}: {exc.strerror or exc}"
        self.stats.lines += len(out)
        return out

    def has_pending(self) -> bool:
        """True when a file has bytes beyond our offset, or the current one shrank below it (cheap fstat)."""
        for r in self._rotated:
            with contextlib.suppress(OSError):
                if os.fstat(r.fd).st_size > r.offset:
                    return True
        f = self._file
        if f is None:
            return False
        try:
            size = os.fstat(f.fd).st_size
            self._note_size(f, size)
        except OSError:
            return False
        return size != f.offset

    def probe(self) -> int:
        """Between reads, without reading: the bytes not read yet (as `pending_bytes`), and the current
        file's size remembered (if its content is still the one read so far), so that a truncation
        before the next read counts in ``lost_bytes`` what this probe saw and no read took. A file that
        appeared while none was open is opened here: a restart before the read would leave it unseen."""
        if self._file is None and not self._open():
            return 0
        f = self._file
        assert f is not None
        with contextlib.suppress(OSError):
            self._note_size(f, size := os.fstat(f.fd).st_size)
            if not f.replaced:  # the probes' looks, evenly spaced, tell whether the writer is still at it
                f.growth.look(self._clock(), size)
        return self.pending_bytes()

    @property
    def replaced(self) -> bool:
        """A probe or `has_pending` saw the current file's content replaced (shrunk, or its fingerprints
        changed) since the last read: the next read handles a truncation."""
        return self._file is not None and bool(self._file.replaced)

    def _note_size(self, f: _File, size: int) -> None:
        """Remember `size` as seen for the current content; if the content was replaced meanwhile, what
        replaced it instead (a size from a restarted server's new content would count its bytes as lost)."""
        same = not f.replaced and size >= max(f.offset, f.seen.size)
        if same and (size == f.seen.size or self._same_content(f, size)):
            if size > f.seen.size:
                f.seen.grow(f.fd, size)
        else:
            f.replaced.note(f.fd, size, self._clock())

    def _same_content(self, f: _File, size: int) -> bool:
        """The file still starts with what was read, and holds it up to our offset, and what a look saw beyond
        it (a few preads: a content read only in part, or not at all, is known by what the looks saw)."""
        if f.head and _pread(f.fd, len(f.head), 0) != f.head:
            return False
        if f.tail and f.offset > len(f.head) and _pread(f.fd, len(f.tail), f.offset - len(f.tail)) != f.tail:
            return False
        return f.seen.size <= f.offset or f.seen.holds(f.fd, size)

    @property
    def unreadable(self) -> str | None:
        """Why the current file cannot be read as a log (not text), or None."""
        return self._file.unreadable if self._file is not None else None

    def pending_bytes(self) -> int:
        """Bytes beyond our offsets in the files held open (cheap fstat); a file that shrank counts whole."""
        pending = 0
        for f in self._held():
            with contextlib.suppress(OSError):
                size = os.fstat(f.fd).st_size
                pending += size - f.offset if size >= f.offset else size
        return pending

    def _held(self) -> list[_File]:
        """The files held open: the rotated ones, oldest first, then the current one."""
        return [*self._rotated, self._file] if self._file is not None else list(self._rotated)

    def close(self) -> None:
        """Close every file; a later poll() reopens the path from offset 0."""
        for f in self._held():
            with contextlib.suppress(OSError):
                os.close(f.fd)
        self._rotated = []
        self._file = None

    def _open(self) -> bool:
        path = self.path
        try:
            # stat first so a FIFO or device at the path is never opened (that can block or have effects).
            before = path.stat()
            if not stat.S_ISREG(before.st_mode):
                kind = "a directory" if stat.S_ISDIR(before.st_mode) else "not a regular file"
                self._error = f"log file {path} is {kind}, not a log: not followed (waiting for a regular file)"
                return False
            for i, r in enumerate(self._rotated):
                if r.ident == (before.st_dev, before.st_ino):  # a rotated file moved back: go on where we were
                    self._file = self._rotated.pop(i)
                    self._error = None
                    return True
            fd = open_log(path)
        except FileNotFoundError:
            parent = path.absolute().parent
            if not parent.is_dir():
                self._error = f"log file {path}: its directory {parent} does not exist (yet); waiting for both"
            else:
                self._error = f"log file {path} does not exist yet"
            return False
        except PermissionError:
            self._error = f"permission denied opening log file {path}"
            return False
        except OSError as exc:
            self._error = f"cannot open log file {path}: {exc.strerror or exc}"
            return False
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            self._error = f"cannot stat log file {path}: {exc.strerror or exc}"
            return False
        if not stat.S_ISREG(st.st_mode):  # swapped between stat() and open()
            os.close(fd)
            self._error = f"log file {path} is not a regular file"
            return False
        self._file = _File(fd, identity(path, before, st))
        self.stats.opens += 1
        self._error = None
        return True

    def _retire(self, f: _File, out: LineBatch) -> None:
        """The path names another file now: keep reading this one as a rotated file (its writer may go on)."""
        self._file = None
        self._rotated.append(f)
        while len(self._rotated) > self._max_rotated:
            oldest = self._rotated.pop(0)
            with contextlib.suppress(OSError):
                self._read(oldest, 1 << 62, out)  # whatever is left in it, before it is let go
            self._close(oldest, out)

    def _close(self, f: _File, out: LineBatch) -> None:
        """Done with a file: its partial line will never be completed, so it is a line."""
        self._flush_partial(f, out)
        with contextlib.suppress(OSError):
            os.close(f.fd)

    def _read_rotated(self, budget: int, out: LineBatch) -> tuple[int, bool]:
        """Read the rotated files to their end; close those their writer has left. (bytes read, all at EOF)"""
        if not self._rotated:
            return 0, True
        used, all_eof = 0, True
        now = self._clock()
        current_grown = self._file.grown_at if self._file is not None else 0.0
        for r in list(self._rotated):
            try:
                size = os.fstat(r.fd).st_size
                if size < r.offset:  # a rotated file truncated: what it held is out of reach
                    self._rotated.remove(r)
                    self._close(r, out)
                    continue
                n, eof = self._read(r, max(1, budget - used), out)
            except OSError:
                self._rotated.remove(r)
                self._close(r, out)
                continue
            used += n
            all_eof = all_eof and eof
            # Closed once quiet for rotate_wait while the current file was written after it: a new writer
            # took over. A server that never reopens its log (llama-server) keeps its rotated file followed.
            if eof and now - r.grown_at >= self._rotate_wait and current_grown > r.grown_at:
                self._rotated.remove(r)
                self._close(r, out)
        return used, all_eof

    def _check_rewritten(self, f: _File, out: LineBatch) -> None:
        """Handle truncation or an in-place rewrite of the current file, counting what is known lost:
        what a look showed beyond our offset, and the contents probes saw replaced before this read."""
        fd, offset = f.fd, f.offset
        size = os.fstat(fd).st_size
        rewritten = bool(f.replaced) or size < max(offset, f.seen.size) or not self._same_content(f, size)
        if rewritten:
            lost = max(0, f.seen.size - offset)
            # What no look saw (written after the last one), estimated as of the first look that found it
            # gone; counted at the first read of the new content, unless a copytruncate hole measures it.
            guess = f.growth.unseen(f.replaced.found_at or self._clock())
            missed, gone = f.replaced.settle(fd, size)
            if f.truncated_at is not None:  # the content before was replaced before its first byte: no hole
                gone += f.guess  # will measure the loss before it, its estimate counts
            self.stats.lost_bytes += lost + gone
            self._flush_partial(f, out)
            f.reset()
            f.truncated_at, f.lost_counted, f.guess = offset, lost, guess
            self.stats.truncations += 1 + missed
        if size > f.seen.size:
            f.seen.grow(fd, size)

    def _path_replaced(self, f: _File) -> bool:
        """At EOF: does the path now name a different file than the one we hold?"""
        try:
            st = self.path.stat()
        except OSError:
            # Deleted or renamed away (or the directory became unreadable): keep the old fd, wait.
            return False
        return (st.st_dev, st.st_ino) != f.ident

    def _read(self, f: _File, limit: int, out: LineBatch) -> tuple[int, bool]:
        """Read up to ``limit`` bytes of ``f``; return (bytes read, reached EOF)."""
        total = 0
        while total < limit:
            want = min(limit - total, self._chunk)
            data = _pread(f.fd, want, f.offset)
            if data:
                self._consume(f, data, out)
                total += len(data)
                f.grown_at = self._clock()
            if len(data) < want:  # a short read on a regular file means EOF (for now)
                return total, True
        return total, False

    def _consume(self, f: _File, data: bytes, out: LineBatch) -> None:
        offset = f.offset
        if offset < _HEAD_BYTES and len(f.head) == offset:
            f.head += data[: _HEAD_BYTES - offset]
        f.tail = data[-_TAIL_BYTES:] if len(data) >= _TAIL_BYTES else (f.tail + data)[-_TAIL_BYTES:]
        f.offset = offset + len(data)
        self.stats.bytes += len(data)
        if f.skip_nul:
            text = data.lstrip(b"\0")
            if not text:
                return
            f.skip_nul = False
            if f.truncated_at is not None:
                # A writer without O_APPEND (llama-server) writes on at its own offset after a truncation:
                # the hole ends where it was when the file was truncated, and what it wrote past our
                # offset before that is only in the copy.
                hole = offset + len(data) - len(text)
                self.stats.lost_bytes += max(0, hole - f.truncated_at - f.lost_counted) if hole else f.guess
                f.truncated_at = None
            data = text
        if not f.sniffed or f.transcode is not None:
            data = self._to_utf8(f, data)
        if f.unreadable is not None:  # binary data: not one line of it is parsed, until the file is rewritten
            return
        if f.record is None:
            self._split(f, data, out)
            return
        lines = LineBatch()  # PowerShell's error records: one opens the content, then one per run appended
        self._split(f, data, lines)
        out.extend(f.record.feed(lines.lines()))
        if f.record.done:
            f.record = None

    def _to_utf8(self, f: _File, data: bytes) -> bytes:
        """The content's bytes as UTF-8: its encoding told by its first bytes, a byte order mark dropped."""
        if not f.sniffed:
            data = f.undecided + data
            encoding = sniff(data)
            if encoding is None:  # too few bytes to tell: wait for more
                f.undecided = data
                return b""
            f.undecided, f.sniffed = b"", True
            data = data[encoding.bom :]
            if not encoding.is_utf8:
                f.transcode = Transcoder(encoding)
            elif recognize.binary_log(data[: recognize.SAMPLE_BYTES]):
                f.unreadable = f"log file {self.path}: {recognize.BINARY}: not followed"
        if f.transcode is not None:
            data = f.transcode(data)
        return data

    def _split(self, f: _File, data: bytes, out: LineBatch) -> None:
        first = data.find(b"\n")
        if first < 0:
            self._append(f, data, out)
            return
        # The first line completes the buffered partial line; the last piece starts the next one.
        last = data.rfind(b"\n")
        self._append(f, data[:first], out)
        self._end_line(f, out)
        if last > first:
            self._complete_lines(f, data[first + 1 : last], out)
        self._append(f, data[last + 1 :], out)

    def _complete_lines(self, f: _File, block: bytes, out: LineBatch) -> None:
        """Whole lines without their final newline: decoded and split in one go unless one is too long."""
        if len(block) > self._max_line and max(map(len, block.split(b"\n"))) > self._max_line:
            for piece in block.split(b"\n"):
                self._append(f, piece, out)
                self._end_line(f, out)
            return
        # Decoding a block equals decoding each line: "\n" and "\r" are never part of a UTF-8 sequence.
        text = block.decode("utf-8", errors="replace")
        if b"\r" not in block:  # kept whole: split into lines only if the batch is asked for them
            out.add_text(text, newlines(block) + 1)
            return
        out.extend(line[:-1] if line.endswith("\r") else line for line in text.split("\n"))

    def _append(self, f: _File, piece: bytes, out: LineBatch) -> None:
        if f.discarding or not piece:
            return
        room = self._max_line - len(f.partial)
        if len(piece) <= room:
            f.partial += piece
            return
        f.partial += piece[:room]
        out.append(cut_utf8(bytes(f.partial)).decode("utf-8", errors="replace"))
        f.partial.clear()
        f.discarding = True
        self.stats.long_lines += 1

    def _end_line(self, f: _File, out: LineBatch) -> None:
        if f.discarding:  # the cut line was already returned
            f.discarding = False
            return
        out.append(_decode(f.partial))
        f.partial.clear()

    def _flush_partial(self, f: _File, out: LineBatch) -> None:
        """The file this partial line belonged to is gone or rewritten: it will never be completed."""
        if f.undecided:  # bytes too few to tell the encoding: take them as UTF-8
            f.partial += f.undecided
            f.undecided = b""
        last: list[str] = []
        if f.discarding:
            f.discarding = False
        elif f.partial:
            last.append(_decode(f.partial))
            f.partial.clear()
        if f.record is not None:
            last = f.record.feed(last) + f.record.flush()
        out.extend(last)
