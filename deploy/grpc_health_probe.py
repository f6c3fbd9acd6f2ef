"""The bytes of HAProxy's gRPC health check (deploy/haproxy.cfg): one HTTP/2 request
`grpc.health.v1.Health/Check` (service "": the whole server) written out frame by frame, for
`tcp-check send-binary`, and the bytes a SERVING answer carries, for `tcp-check expect rbinary`.

HAProxy's http-check cannot send a gRPC message (its 5-byte prefix has NUL bytes), so the check
speaks HTTP/2 itself: the client preface, an empty SETTINGS frame, a HEADERS frame (HPACK
literals, no Huffman coding) and a DATA frame holding the empty HealthCheckRequest. A server that
answers SERVING sends a DATA frame whose message is `08 01` (field 1 = 1); NOT_SERVING (a
draining replica) is `08 02`, and the check fails. Run this file to print both.
"""

from __future__ import annotations

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = b"/grpc.health.v1.Health/Check"
SERVING_MESSAGE = bytes.fromhex("00" "00000002" "0801")  # not compressed, 2 bytes: status = SERVING


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def literal(prefix: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, its name given by `prefix`."""
    return prefix + bytes([len(value)]) + value


def probe() -> bytes:
    headers = (b"\x83"  # :method POST (static table 3)
               b"\x86"  # :scheme http (static table 6)
               + literal(b"\x04", PATH)  # :path
               + literal(b"\x01", b"localhost")  # :authority
               + literal(b"\x0f\x10", b"application/grpc")  # content-type (static table 31)
               + literal(b"\x00\x02te", b"trailers"))
    return (PREFACE + frame(0x4, 0, 0, b"")  # SETTINGS (defaults)
            + frame(0x1, 0x4, 1, headers)  # HEADERS, END_HEADERS
            + frame(0x0, 0x1, 1, b"\x00\x00\x00\x00\x00"))  # DATA, END_STREAM: an empty HealthCheckRequest


if __name__ == "__main__":
    print("tcp-check send-binary", probe().hex())
    print("tcp-check expect rbinary", SERVING_MESSAGE.hex())
