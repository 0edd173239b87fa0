"""How long a recording is, from its own bytes: what a platform says is what the sender's app
claimed (Telegram's ``duration``), and most say nothing (Signal, WhatsApp, the page, mail).

Read without decoding, from the formats' own counts: Ogg Opus's last granule position less its
pre-skip (Telegram's, WhatsApp's, Element's and Firefox's voice notes), ADTS's frames
(Signal's), MP4's ``mvhd`` (Safari's, a phone's .m4a), WebM's latest block (Chromium's, one
frame short), WAV's data over its byte rate (the API's input_audio), MP3's frames (a file sent
as audio, a podcast by mail). Anything else: None.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from nanobot.media.aac import SAMPLES_PER_FRAME, RATES, adts_frames

_HEAD_SCAN = 512  # the codec's identification header is in the first page
EBML = b"\x1a\x45\xdf\xa3"
# Matroska elements whose children are walked: Segment, Info, Cluster, BlockGroup.
_WEBM_PARENTS = {0x18538067, 0x1549A966, 0x1F43B675, 0xA0}
_WEBM_SCALE, _WEBM_CLUSTER_TIME, _WEBM_BLOCKS = 0x2AD7B1, 0xE7, {0xA3, 0xA1}  # TimecodeScale, Timecode, (Simple)Block
_WEBM_MAX_ELEMENTS = 1_000_000  # a 25 MB file of empty elements is no recording: give up
# MP3 (MPEG audio Layer III): kbit/s by bit-rate index, for MPEG-1 and for MPEG-2 and 2.5; sample
# rates by the header's version bits (3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5).
_MP3_KBPS = {True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
             False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_MAX_FRAMES = 500_000  # over three hours; a file of countless tiny frames is no recording


def recording_seconds(data: bytes) -> float | None:
    """Seconds of audio in ``data``; None when its format is not one of these, or says nothing."""
    if data.startswith(b"OggS"):
        return _ogg_seconds(data)
    if data.startswith(EBML):
        return _webm_seconds(data)
    if data[4:8] == b"ftyp":
        return _mp4_seconds(data)
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return _wav_seconds(data)
    if data.startswith(b"ID3") or len(data) > 1 and data[0] == 0xFF and data[1] & 0xE6 == 0xE2:  # Layer III
        return _mp3_seconds(data)
    frames, found = adts_frames(data)
    return len(frames) * SAMPLES_PER_FRAME / RATES[found[1]] if frames and found else None


def _ogg_seconds(data: bytes) -> float | None:
    head = data[:_HEAD_SCAN]
    at, last = head.find(b"OpusHead"), _last_ogg_page(data)
    if at < 0 or len(head) < at + 12 or last is None:
        return None  # no Opus (Vorbis voice notes are rare): unknown
    skip = struct.unpack_from("<H", head, at + 10)[0]  # samples the decoder drops at the start
    granule = struct.unpack_from("<q", data, last + 6)[0]  # samples at 48 kHz up to the last page's end
    return max(granule - skip, 0) / 48000 if granule > 0 else None


def _last_ogg_page(data: bytes) -> int | None:
    """Where the last whole page begins: "OggS" may also occur inside the sound, so a page counts
    when its header holds (version 0) and its segments end within the file."""
    at = len(data)
    for _ in range(64):
        at = data.rfind(b"OggS", 0, at)
        if at < 0:
            return None
        if len(data) >= at + 27 and data[at + 4] == 0:
            count = data[at + 26]
            if at + 27 + count + sum(data[at + 27:at + 27 + count]) <= len(data):
                return at
    return None


def _mp4_seconds(data: bytes) -> float | None:
    """``moov``/``mvhd``'s duration over its timescale, found by walking the boxes (the bytes
    "mvhd" may occur in the sound, and a phone writes ``moov`` after it)."""
    moov = _box(data, b"moov", 0)
    at = _box(data, b"mvhd", moov) if moov is not None else None
    if at is None or len(data) < at + 32:
        return None
    version = data[at]
    fields = ">IQ" if version == 1 else ">II"  # timescale, duration (after the two dates)
    timescale, duration = struct.unpack_from(fields, data, at + 4 + (16 if version == 1 else 8))
    return duration / timescale if timescale and duration and duration != 2**32 - 1 else None


def _box(data: bytes, kind: bytes, at: int) -> int | None:
    """Where the body of the first box of ``kind`` from ``at`` on begins (boxes of one level)."""
    return next((body for found, body in _boxes(data, at) if found == kind), None)


def _boxes(data: bytes, at: int) -> Iterator[tuple[bytes, int]]:
    """(type, where its body begins) of each box from ``at`` on: 32-bit sizes, 64-bit ones (1),
    and "to the end" (0)."""
    end = len(data)
    for _ in range(1024):
        if at + 8 > end:
            return
        size, kind, body = int.from_bytes(data[at:at + 4], "big"), data[at + 4:at + 8], at + 8
        if size == 1 and at + 16 <= end:
            size, body = int.from_bytes(data[at + 8:at + 16], "big"), at + 16
        size = end - at if size == 0 else size
        if size < body - at:
            return
        yield kind, body
        at += size


def _wav_seconds(data: bytes) -> float | None:
    """The data chunk's size over the fmt chunk's byte rate (the API's input_audio: WAV), the
    chunks walked from the RIFF header on; a file cut short counts what is there."""
    at, byte_rate = 12, 0
    for _ in range(256):
        if at + 8 > len(data):
            return None
        kind, size = data[at:at + 4], int.from_bytes(data[at + 4:at + 8], "little")
        if kind == b"fmt " and at + 16 <= len(data) - 4:
            byte_rate = int.from_bytes(data[at + 16:at + 20], "little")
        elif kind == b"data":
            return min(size, len(data) - at - 8) / byte_rate if byte_rate else None
        at += 8 + size + (size & 1)  # chunks are padded to an even length
    return None


def _mp3_seconds(data: bytes) -> float | None:
    """Each frame's samples over its rate, the frames walked from the first (behind an ID3v2 tag),
    each header giving its length; a tag or anything else behind the frames ends the walk."""
    at = 10 + int.from_bytes(bytes(b & 0x7F for b in data[6:10]), "big") if data.startswith(b"ID3") else 0
    at += 10 if at and data[5] & 0x10 else 0  # the tag's footer
    seconds, frames = 0.0, 0
    while at + 4 <= len(data) and frames < _MP3_MAX_FRAMES:
        header = int.from_bytes(data[at:at + 4], "big")
        version, kbps, rate, padding = header >> 19 & 3, header >> 12 & 15, header >> 10 & 3, header >> 9 & 1
        if header >> 21 != 0x7FF or version == 1 or header >> 17 & 3 != 1 or kbps in (0, 15) or rate == 3:
            break
        mpeg1, rate = version == 3, _MP3_RATES[version][rate]
        at += (144 if mpeg1 else 72) * 1000 * _MP3_KBPS[mpeg1][kbps] // rate + padding
        seconds, frames = seconds + (1152 if mpeg1 else 576) / rate, frames + 1
    return seconds or None


def _webm_seconds(data: bytes) -> float | None:
    """The latest block's time: a recorder (Chromium's MediaRecorder) may write no Duration and
    parents of unknown size, so each cluster's time plus its blocks' offsets is the count kept."""
    at, scale, cluster, latest = 0, 1_000_000, 0, None  # scale: nanoseconds a tick (the default)
    for _ in range(_WEBM_MAX_ELEMENTS):
        element, at = _vint(data, at, keep_marker=True)
        size, at = _vint(data, at)
        if element in _WEBM_PARENTS and size is not None:
            continue  # its children follow (its size may be unknown: a live recording's)
        if element is None or size is None or size < 0:
            break
        body = data[at:at + size]
        if element == _WEBM_SCALE:
            scale = int.from_bytes(body, "big") or scale
        elif element == _WEBM_CLUSTER_TIME:
            cluster = int.from_bytes(body, "big")
        elif element in _WEBM_BLOCKS and (track := _vint(body, 0))[0] is not None and len(body) >= track[1] + 2:
            offset = int.from_bytes(body[track[1]:track[1] + 2], "big", signed=True)
            latest = max(latest or 0, cluster + offset)
        at += size
    return latest * scale / 1e9 if latest else None


def _vint(data: bytes, at: int, keep_marker: bool = False) -> tuple[int | None, int]:
    """An EBML variable-length number at ``at`` and where the next begins; None at the end or
    for a broken one; -1 for a size of all ones (unknown: a parent still being written)."""
    if at >= len(data) or not data[at]:
        return None, at
    length = 9 - data[at].bit_length()
    if at + length > len(data):
        return None, at
    value = int.from_bytes(data[at:at + length], "big")
    if keep_marker:
        return value, at + length
    value &= (1 << (7 * length)) - 1
    return (-1 if value == (1 << (7 * length)) - 1 else value), at + length
