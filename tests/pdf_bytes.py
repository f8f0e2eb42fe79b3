"""The bytes of a minimal PDF from its objects, for test helpers that write PDFs by hand."""
from __future__ import annotations


def pdf_from_objects(objs: list[bytes]) -> bytes:
    """Objects numbered 1.. in order (1 the catalog), with the cross-reference table and trailer."""
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)
