#!/usr/bin/python3
# Writes pages compressed by the reference C libraries, as makedumpfile
# compresses kdump pages: zlib compress2 (-c), liblzo2 lzo1x_1 (-l),
# libsnappy (-p), libzstd one frame (-z). Debian 12: apt-get install
# python3-lzo python3-snappy python3-zstandard; run from this directory.
# Each file holds, per page, a little-endian uint32 length and the bytes.
# The page contents are rebuilt by codecPage in ../../kdump_test.go.
import struct, zlib, lzo, snappy, zstandard

def page(k):
    if k == 0:
        return bytes(4096)
    if k == 1:
        return bytes((i * 7 + 3) % 251 for i in range(4096))
    if k == 2:
        return "".join("the quick brown fox %05d " % i for i in range(200)).encode()[:4096]
    x, out = 12345, bytearray()
    for i in range(2048):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append((x >> 16) & 0xFF)
    return bytes(out) + bytes(2048)

codecs = {
    "zlib": lambda d: zlib.compress(d, 1),
    "lzo": lambda d: lzo.compress(d, 1, False),
    "snappy": snappy.compress,
    "zstd": lambda d: zstandard.ZstdCompressor(level=1, write_content_size=True).compress(d),
}
for name, c in codecs.items():
    with open(name + ".pages", "wb") as f:
        for k in range(4):
            b = c(page(k))
            assert len(b) < 4096, (name, k, len(b))
            f.write(struct.pack("<I", len(b)) + b)
