"""The store's side of paging as a mode (core/paged_log.py, docs/durability.md "Paging"): where
paged messages' entries lie, reading windows back, and the hold paged entries keep on the
journal's segments.

- A message routed to a paged log is journaled as any other (its ADD entry, replicated as
  usual), but the store keeps no object for it: once its record is on disk (`synced`) the
  log gets the entry's segment, offset and length, and the object goes.
- A segment holds on to its paged entries like to its live objects: `SegmentInfo.paged`
  counts them (their bytes are in `live_bytes`) and `SegmentInfo.tail` says, per log, how
  many and between which entry numbers, so that a segment with paged entries is never
  deleted, and compaction can find them.
- `page_in` reads a queue's next entries back (one `pread` per run of neighbouring
  entries, as a batched read of bodies does) into messages the store tracks as any live
  message of that queue; `release` lets go of the entries every reader has passed.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable

from pairmq.core import Message
from pairmq.core.paged_log import Chunk, PagedLog
from pairmq.store.record_decoding import decode_lone_add
from pairmq.store.writer import SegmentInfo

_RUN_GAP = 64 * 1024  # bytes between two entries read along with them
_RUN_BYTES = 8 * 1024 * 1024  # one pread reads at most this much


def _will_need(fd: int, offset: int, length: int) -> None:
    os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)


class PagedEntries:
    """The journal's paged entries: written, on disk, read back, released."""

    def __init__(self, segments: Callable[[], dict[int, SegmentInfo]],
                 read_fd: Callable[[int], int]) -> None:
        self._segments = segments  # the writer's segments (they change at every roll)
        self._read_fd = read_fd  # a file descriptor open on a segment, for pread
        self._written: list[tuple[int, Message, int, int, int]] = []  # seq, message, where
        self._moved: list[tuple[int, PagedLog, int, int, int]] = []  # seq, log, entry, where
        self.count = 0  # entries held in all logs, located
        self.bytes = 0  # ... and the bytes their messages count

    # ------------------------------------------------------------ writing

    def written(self, seq: int, message: Message, segment_id: int, offset: int,
                length: int) -> None:
        """The ADD entry of a paged message was appended at (segment, offset, length)."""
        self._written.append((seq, message, segment_id, offset, length))

    def moved(self, seq: int, log: PagedLog, number: int, segment_id: int,
              offset: int) -> None:
        """Entry `number` of `log` was copied to (segment, offset) (compaction): it moves
        there once that record is on disk."""
        self._moved.append((seq, log, number, segment_id, offset))

    def _settle_moves(self, seq: int, segments: dict[int, SegmentInfo]) -> None:
        moved = self._moved
        done = 0
        for record_seq, log, number, segment_id, offset in moved:
            if record_seq > seq:
                break
            done += 1
            if number < log.released or number >= log.located_end:
                continue  # passed by every reader meanwhile: nothing to move
            old_segment, _old, length, _order, _size, _seq = log.where(number)
            self._let_go(segments.get(old_segment), log, length)
            log.move(number, segment_id, offset)
            self._hold(segments[segment_id], log, number, length)
            self.count -= 1  # _hold counted it again
        del moved[:done]

    def synced(self, seq: int) -> list[PagedLog]:
        """Records up to `seq` are on disk: their paged messages are located in their logs
        (and copies made by compaction take over from the originals). Returns the logs
        that got entries."""
        segments = self._segments()
        if self._moved and self._moved[0][0] <= seq:
            self._settle_moves(seq, segments)
        written = self._written
        if not written or written[0][0] > seq:
            return []
        logs: dict[PagedLog, None] = {}
        done = 0
        for record_seq, message, segment_id, offset, length in written:
            if record_seq > seq:
                break
            done += 1
            log = message.log
            if log is None:  # its log went (its queues were deleted) before it was on disk
                continue
            message.log = None
            stamp = int(message.headers.get("timestamp", "0")) if log.stamped else None
            number = log.locate(message, segment_id, offset, length, record_seq, stamp)
            self._hold(segments[segment_id], log, number, length)
            self.bytes += message.size
            logs[log] = None
        del written[:done]
        return list(logs)

    def _hold(self, info: SegmentInfo, log: PagedLog, number: int, length: int) -> None:
        info.paged += 1
        info.live_bytes += length
        span = info.tail.get(log)
        if span is None:
            info.tail[log] = [1, number, number]
        else:
            span[0] += 1
            if number < span[1]:
                span[1] = number
            if number > span[2]:
                span[2] = number
        self.count += 1

    @staticmethod
    def _let_go(info: SegmentInfo | None, log: PagedLog, length: int) -> None:
        """One entry of `log` no longer holds this segment."""
        if info is None:
            return
        info.paged -= 1
        info.live_bytes -= length
        span = info.tail.get(log)
        if span is not None:
            span[0] -= 1
            if span[0] <= 0:
                del info.tail[log]

    def hold_recovered(self, log: PagedLog, segments: dict[int, SegmentInfo]) -> None:
        """A recovered log: its entries from the first one a reader still needs hold their
        `segments` (those before are let go at once)."""
        log.released = min(log.min_cursor(), log.located_end)
        log.drop_passed()
        for first, chunk, i in log.chunks_from(log.released):
            seg = chunk.segment[i:]
            if seg.tobytes() == seg[:1].tobytes() * len(seg):
                # the common case, a chunk written into one segment (compared as bytes: a
                # pass over ten million entries in Python took 0.6 s of a start)
                self._hold_run(segments, log, first, chunk, i, len(chunk))
                continue
            ids = list(seg)
            if ids == sorted(ids):  # written in order: a run per segment, found by bisection
                at = 0
                while at < len(ids):
                    end = bisect_right(ids, ids[at], at)
                    self._hold_run(segments, log, first + at, chunk, i + at, i + end)
                    at = end
                continue
            for k in range(i, len(chunk)):  # moved by compaction, in no order
                info = segments.get(chunk.segment[k])
                if info is None:
                    raise OSError(f"a paged message's entry is in journal segment "
                                  f"{chunk.segment[k]}, which is gone")
                self._hold(info, log, first + k - i, chunk.length[k])
                self.bytes += chunk.size[k]

    def _hold_run(self, segments: dict[int, SegmentInfo], log: PagedLog, first: int,
                  chunk: Chunk, start: int, end: int) -> None:
        """Entries `start`..`end` of `chunk` (numbered from `first` in `log`), all in one
        segment, hold it: counted at once."""
        segment_id = chunk.segment[start]
        info = segments.get(segment_id)
        if info is None:
            raise OSError(f"paged messages' entries are in journal segment {segment_id}, "
                          "which is gone")
        count = end - start
        whole = count == len(chunk) == chunk.summed  # the chunk's sums cover these
        info.paged += count
        info.live_bytes += chunk.length_total if whole else sum(chunk.length[start:end])
        span = info.tail.setdefault(log, [0, first, first])
        span[0] += count
        span[1] = min(span[1], first)
        span[2] = max(span[2], first + count - 1)
        self.count += count
        self.bytes += chunk.size_total if whole else sum(chunk.size[start:end])

    # ------------------------------------------------------------ reading back

    def page_in(self, log: PagedLog, numbers: list[int]
                ) -> list[tuple[Message, int, int, int]]:
        """Entries `numbers` of `log`, read back: (message, segment, body offset, record
        seq) each, the message with its body and the size its log kept for it. The caller
        tracks each as a live message of the queue that reads."""
        where = [log.where(n) for n in numbers]
        out: list[tuple[Message, int, int, int]] = []
        i = 0
        while i < len(where):
            segment_id, start = where[i][0], where[i][1]
            end = start + where[i][2]
            j = i + 1
            while j < len(where):
                seg, off, length = where[j][0], where[j][1], where[j][2]
                if seg != segment_id or not end <= off <= end + _RUN_GAP \
                        or off + length - start > _RUN_BYTES:
                    break
                end = off + length
                j += 1
            fd = self._read_fd(segment_id)
            span = memoryview(os.pread(fd, end - start, start))
            if len(span) != end - start:
                raise OSError(f"journal segment {segment_id}: read {len(span)} of "
                              f"{end - start} bytes of paged messages at offset {start}")
            for seg, off, length, _order, size, seq in where[i:j]:
                fields = decode_lone_add(span[off - start:off - start + length])
                if fields is None:
                    raise OSError(f"journal segment {seg}: no message entry at offset {off}")
                (order, expires, priority, persistent, _deliveries, message_id, destination,
                 headers, _queues, body_at, body_length, _meta) = fields
                body = bytes(span[off - start + body_at:off - start + body_at + body_length])
                message = Message(message_id, destination, headers, body, bool(persistent),
                                  priority, expires, size, order)
                message.body_length = body_length
                out.append((message, seg, off + body_at, seq))
            i = j
        if numbers:
            self._read_ahead(log, numbers[-1] + 1, len(numbers))
        return out

    def _read_ahead(self, log: PagedLog, first: int, count: int) -> None:
        """Ask the kernel to bring the `count` entries from `first` on (the window a reader
        most likely asks for next) into the page cache in the background: a queue draining
        a backlog that is not in the cache then reads its next window from memory, instead
        of holding the event loop 100 ms on the disk for each (docs/benchmarks.md). Two
        lookups and a system call or two per window, never more than _RUN_BYTES asked for
        in a segment; only a hint (errors are ignored)."""
        last = min(first + count, log.located_end) - 1
        if last < first or first < log.start:
            return
        seg_a, off_a = log.where(first)[:2]
        seg_b, off_b, length_b = log.where(last)[:3]
        try:
            if seg_a == seg_b and off_b >= off_a:
                _will_need(self._read_fd(seg_a), off_a,
                           min(off_b + length_b - off_a, _RUN_BYTES))
            else:  # across segments (or moved by compaction): both ends, roughly
                _will_need(self._read_fd(seg_a), off_a, _RUN_BYTES)
                end = off_b + length_b
                start = max(0, end - _RUN_BYTES)
                _will_need(self._read_fd(seg_b), start, end - start)
        except OSError:
            pass

    # ------------------------------------------------------------ letting go

    def release(self, log: PagedLog) -> None:
        """Entries every reader of `log` has passed no longer hold their segments."""
        upto = log.min_cursor()
        upto = min(upto, log.located_end)
        if upto <= log.released:
            log.drop_passed()
            return
        segments = self._segments()
        for number in range(log.released, upto):
            segment_id, _off, length, _order, size, _seq = log.where(number)
            self._let_go(segments.get(segment_id), log, length)
            self.count -= 1
            self.bytes -= size
        log.released = upto
        log.drop_passed()
