"""Raw AAC (ADTS, Signal's voice notes) into an M4A file, the same sound repacked, no decoding.

OpenAI's transcription endpoint takes M4A, MP3, Ogg, WAV and WebM but refuses ``.aac``, and
converting with ffmpeg needs a system package. ADTS is AAC frames each behind a 7- or 9-byte
header; MP4 holds the same frames behind one index (ISO/IEC 14496-12 boxes, the AAC
configuration in ``esds``, 14496-1 and 14496-3), which is all written here.
"""

from __future__ import annotations

import struct

SAMPLES_PER_FRAME = 1024  # AAC-LC: every frame is 1024 samples per channel
RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
MAX_FRAMES = 200_000  # over an hour at 48 kHz; more is no voice note but a loop of tiny frames to burn CPU
_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)  # identity


def adts_to_m4a(data: bytes) -> bytes | None:
    """The M4A file of an ADTS stream; None when ``data`` is no ADTS this can repack (then it is
    sent as it is)."""
    frames, config = adts_frames(data)
    if not frames or config is None:
        return None
    profile, rate_index, channels = config
    rate, asc = RATES[rate_index], _audio_specific_config(profile, rate_index, channels)
    ftyp = _box(b"ftyp", b"M4A " + struct.pack(">I", 0) + b"M4A mp42isom")
    first_frame = len(ftyp) + len(_moov(frames, rate, channels, asc, offset=0)) + 8  # behind mdat's header
    return ftyp + _moov(frames, rate, channels, asc, first_frame) + _box(b"mdat", b"".join(frames))


def adts_frames(data: bytes) -> tuple[list[bytes], tuple[int, int, int] | None]:
    """The raw AAC frames and (profile, rate index, channels) of the first header; nothing if a
    header is broken or the stream changes its format midway. A last frame cut short is left out."""
    frames: list[bytes] = []
    config = None
    at = 0
    while at + 7 <= len(data) and len(frames) <= MAX_FRAMES:
        header = int.from_bytes(data[at:at + 7], "big")
        sync, layer, no_crc = header >> 44, (header >> 41) & 3, (header >> 40) & 1
        this = ((header >> 38) & 3, (header >> 34) & 15, (header >> 30) & 7)
        length, blocks = (header >> 13) & 0x1FFF, header & 3
        size = 7 if no_crc else 9
        if frames and at + length > len(data):
            break  # a recording cut short: its whole frames
        if sync != 0xFFF or layer or blocks or this[1] >= len(RATES) or not this[2] \
                or length <= size or at + length > len(data) or config not in (None, this):
            return [], None
        config = this
        frames.append(data[at + size:at + length])
        at += length
    return (frames, config) if len(frames) <= MAX_FRAMES else ([], None)


def _audio_specific_config(profile: int, rate_index: int, channels: int) -> bytes:
    # 5 bits object type (the ADTS profile + 1), 4 bits rate index, 4 bits channels, 3 bits 0.
    return struct.pack(">H", (profile + 1) << 11 | rate_index << 7 | channels << 3)


def _moov(frames: list[bytes], rate: int, channels: int, asc: bytes, offset: int) -> bytes:
    duration = len(frames) * SAMPLES_PER_FRAME
    mvhd = _full(b"mvhd", struct.pack(">IIII", 0, 0, rate, duration) + struct.pack(">IH", 0x10000, 0x100)
                 + bytes(10) + _MATRIX + bytes(24) + struct.pack(">I", 2))
    tkhd = _full(b"tkhd", struct.pack(">IIIII", 0, 0, 1, 0, duration) + bytes(8) + struct.pack(">HHHH", 0, 0, 0x100, 0)
                 + _MATRIX + struct.pack(">II", 0, 0), flags=7)  # enabled, in the movie, in the preview
    mdhd = _full(b"mdhd", struct.pack(">IIII", 0, 0, rate, duration) + struct.pack(">HH", 0x55C4, 0))  # "und"
    hdlr = _full(b"hdlr", struct.pack(">I", 0) + b"soun" + bytes(12) + b"SoundHandler\0")
    dinf = _box(b"dinf", _full(b"dref", struct.pack(">I", 1) + _full(b"url ", b"", flags=1)))
    stbl = _box(b"stbl", b"".join([
        _full(b"stsd", struct.pack(">I", 1) + _mp4a(rate, channels, asc, frames)),
        _full(b"stts", struct.pack(">III", 1, len(frames), SAMPLES_PER_FRAME)),
        _full(b"stsc", struct.pack(">IIII", 1, 1, len(frames), 1)),  # every frame in one chunk
        _full(b"stsz", struct.pack(">II", 0, len(frames)) + b"".join(struct.pack(">I", len(f)) for f in frames)),
        _full(b"stco", struct.pack(">II", 1, offset))]))
    minf = _box(b"minf", _full(b"smhd", bytes(4)) + dinf + stbl)
    trak = _box(b"trak", tkhd + _box(b"mdia", mdhd + hdlr + minf))
    return _box(b"moov", mvhd + trak)


def _mp4a(rate: int, channels: int, asc: bytes, frames: list[bytes]) -> bytes:
    bitrate = sum(map(len, frames)) * 8 * rate // (len(frames) * SAMPLES_PER_FRAME)
    decoder = _descriptor(4, bytes([0x40, 0x15])  # MPEG-4 audio; an audio stream
                          + max(map(len, frames)).to_bytes(3, "big") + struct.pack(">II", bitrate, bitrate)
                          + _descriptor(5, asc))
    es = _descriptor(3, struct.pack(">HB", 1, 0) + decoder + _descriptor(6, b"\x02"))
    return _box(b"mp4a", bytes(6) + struct.pack(">H", 1) + bytes(8)
                + struct.pack(">HHHHI", channels, 16, 0, 0, (rate << 16) & 0xFFFFFFFF) + _full(b"esds", es))


def _descriptor(tag: int, body: bytes) -> bytes:
    return bytes([tag, len(body)]) + body  # every body here is under 128 bytes: a one-byte length


def _box(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", 8 + len(body)) + kind + body


def _full(kind: bytes, body: bytes, flags: int = 0) -> bytes:
    return _box(kind, struct.pack(">I", flags) + body)  # version 0
