"""towerpack tests: what the PyTorch reference checks share (tests/*/torch_*.py).
Importing it gives numpy, torch and torch.nn.functional, or exits 77 (the
test skips) when python3 lacks them; load() reads a towerpack checkpoint's
float32 tensors; verdict() prints the line the C side looks for."""
import json
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"python3 lacks torch or numpy ({e}): install python3-torch")
    sys.exit(77)

__all__ = ["np", "torch", "F", "load", "verdict"]


def load(path):
    """The float32 tensors of a safetensors file, by name, as numpy arrays."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out


def verdict(ok):
    """'pytorch agrees' (exit status 0) or 'pytorch disagrees' (1)."""
    print("pytorch agrees" if ok else "pytorch disagrees")
    return 0 if ok else 1
