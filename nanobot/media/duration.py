"""How long a recording is, from its own bytes: what a platform says is what the sender's app
claimed (Telegram's ``duration``), and most say nothing (Signal, WhatsApp, the page, mail).

Read without decoding, from the formats' own counts: Ogg Opus's last granule position less its
pre-skip (Telegram's, WhatsApp's, Element's and Firefox's voice notes), ADTS's frames
(Signal's), MP4's ``mvhd`` (Safari's, a phone's .m4a). WebM (Chromium's recordings) keeps no
total: None, as for anything else.
"""

from __future__ import annotations

import struct

from nanobot.media.aac import SAMPLES_PER_FRAME, RATES, adts_frames

_HEAD_SCAN = 512  # the codec's identification header is in the first page


def recording_seconds(data: bytes) -> float | None:
    """Seconds of audio in ``data``; None when its format is not one of these, or says nothing."""
    if data.startswith(b"OggS"):
        return _ogg_seconds(data)
    if data[4:8] == b"ftyp":
        return _mp4_seconds(data)
    frames, found = adts_frames(data)
    return len(frames) * SAMPLES_PER_FRAME / RATES[found[1]] if frames and found else None


def _ogg_seconds(data: bytes) -> float | None:
    head = data[:_HEAD_SCAN]
    at, last = head.find(b"OpusHead"), data.rfind(b"OggS")
    if at < 0 or len(head) < at + 12 or len(data) < last + 14:
        return None  # no Opus (Vorbis voice notes are rare): unknown
    skip = struct.unpack_from("<H", head, at + 10)[0]  # samples the decoder drops at the start
    granule = struct.unpack_from("<q", data, last + 6)[0]  # samples at 48 kHz up to the last page's end
    return max(granule - skip, 0) / 48000 if granule > 0 else None


def _mp4_seconds(data: bytes) -> float | None:
    at = data.find(b"mvhd")
    if at < 4:
        return None
    version = data[at + 4]
    fields = ">IQ" if version == 1 else ">II"  # timescale, duration (after the two dates)
    start = at + 8 + (16 if version == 1 else 8)
    if len(data) < start + struct.calcsize(fields):
        return None
    timescale, duration = struct.unpack_from(fields, data, start)
    return duration / timescale if timescale and duration and duration != 2**32 - 1 else None
