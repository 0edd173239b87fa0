"""Media made in the test: a real JPEG, a PDF with a text layer, a scanned PDF, a DOCX."""

from __future__ import annotations

import io


def jpeg(width: int = 3000, height: int = 2000, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "JPEG", quality=95)
    return out.getvalue()


def png(width: int = 400, height: int = 300) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGBA", (width, height), (0, 120, 255, 128)).save(out, "PNG")
    return out.getvalue()


def pdf_with_text(*lines: str) -> bytes:
    """A one-page PDF whose text layer holds ``lines`` (written by hand: no PDF writer needed)."""
    text = " ".join(f"({line}) Tj 0 -16 Td" for line in lines)
    stream = f"BT /F1 12 Tf 72 720 Td {text} ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def scanned_pdf() -> bytes:
    """A PDF with a page and no text layer, as a scanner makes (here: a blank page)."""
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(612, 792)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def docx(*paragraphs: str) -> bytes:
    import docx as python_docx

    document = python_docx.Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "total", "42"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def docx_inflating_to(megabytes: int, paragraph: str = "all work and no play makes jack a dull boy") -> bytes:
    """A small DOCX whose document.xml inflates to ``megabytes`` of paragraphs (a zip bomb
    when large; 140 MB packs into about 500 KB)."""
    import zipfile

    source = zipfile.ZipFile(io.BytesIO(docx("x")))
    para = f"<w:p><w:r><w:t>{paragraph}</w:t></w:r></w:p>".encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for member in source.infolist():
            data = source.read(member.filename)
            if member.filename == "word/document.xml":
                head, tail = data.split(b"<w:body>")
                data = head + b"<w:body>" + para * (megabytes * 1024 * 1024 // len(para)) + tail
            archive.writestr(member.filename, data)
    return out.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def ogg_opus() -> bytes:
    """A real OGG/Opus file of 20 ms of silence (the header, the tags, one audio page): what a
    speech server sends for ``response_format="opus"`` and Telegram takes as a voice note."""
    import struct

    def crc(data: bytes) -> int:  # Ogg's CRC-32: polynomial 0x04C11DB7, not reflected, no final xor
        value = 0
        for byte in data:
            value ^= byte << 24
            for _ in range(8):
                value = ((value << 1) ^ 0x04C11DB7 if value & 0x80000000 else value << 1) & 0xFFFFFFFF
        return value

    def page(packet: bytes, flags: int, granule: int, sequence: int) -> bytes:
        lacing = bytes([255] * (len(packet) // 255) + [len(packet) % 255])
        header = b"OggS" + struct.pack("<BBqIIIB", 0, flags, granule, 0x6E616E6F, sequence, 0, len(lacing)) + lacing
        checksum = crc(header + packet)
        return header[:22] + struct.pack("<I", checksum) + header[26:] + packet

    head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, 48000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 7) + b"nanobot" + struct.pack("<I", 0)
    silence = bytes([0xF8, 0xFF, 0xFE])  # one 20 ms CELT frame of silence
    return page(head, 0x02, 0, 0) + page(tags, 0, 0, 1) + page(silence, 0x04, 312 + 960, 2)


def adts_aac(seconds: float = 1.0, rate: int = 16000, layout: str = "mono") -> bytes:
    """A real ADTS AAC stream of a 440 Hz tone, as Signal records voice notes."""
    return encoded_audio(seconds, "aac", "adts", rate, layout)


def encoded_audio(seconds: float, codec: str, container: str, rate: int = 16000, layout: str = "mono",
                  tone: bool = True) -> bytes:
    """A real recording of a 440 Hz tone (or silence), encoded by FFmpeg (PyAV's wheel): AAC in
    ADTS or MP4, Opus in Ogg or WebM (written live, as Chromium's MediaRecorder does)."""
    import math
    import struct

    import av

    out = io.BytesIO()
    live = {"live": "1"} if container == "webm" else {}  # sizes unknown, as a recorder writes as it goes
    with av.open(out, "w", format=container, options=live) as file:
        stream = file.add_stream(codec, rate=rate, layout=layout)
        total, at, channels = int(seconds * rate), 0, 2 if layout == "stereo" else 1
        while at < total:
            frame = av.AudioFrame(format="s16", layout=layout, samples=min(960, total - at))
            sound = b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * (at + i) / rate))) * channels
                             for i in range(frame.samples)) if tone else b""
            frame.planes[0].update(sound.ljust(frame.planes[0].buffer_size, b"\0"))
            frame.rate, frame.pts, at = rate, at, at + frame.samples
            file.mux(stream.encode(frame))
        file.mux(stream.encode(None))
    return out.getvalue()


def decoded_audio(data: bytes) -> tuple[str, int, bytes]:
    """(the container's format, the sample rate, every decoded sample) of a recording, by FFmpeg."""
    import av

    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].rate
        samples = b"".join(bytes(plane) for frame in container.decode(audio=0) for plane in frame.planes)
        return container.format.name, rate, samples
