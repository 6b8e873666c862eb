# The one safetensors reader of the Python tests: parsed with struct + json only (no
# `safetensors` package on Debian), so each test can turn the raw bytes into what it compares
# (bytes, tuples, numpy arrays, torch tensors).
import json
import struct


def read_entries(path):
    """(name → (header entry, raw bytes) for every tensor, the whole header with `__metadata__`)."""
    with open(path, "rb") as f:
        data = f.read()
    (header_bytes,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_bytes])
    base = 8 + header_bytes
    return {name: (entry, data[base + entry["data_offsets"][0]:base + entry["data_offsets"][1]])
            for name, entry in header.items() if name != "__metadata__"}, header
