"""Content digests of training state, which the restore check compares tensor by tensor."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import torch

DIGEST_CHUNK_BYTES = 16 << 20


def tensor_digest(tensor: torch.Tensor, after_chunk: Callable[[np.ndarray], None] | None = None) -> str:
    """sha256 of dtype, shape and bytes, fed in chunks; `after_chunk` sees each chunk once it is hashed
    (a mapped file's pages can be dropped there, so a flat group of GBs is never resident at once)."""
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    data = t.numpy().reshape(-1).view(np.uint8)  # the buffer itself: tobytes() would copy it
    for start in range(0, data.size, DIGEST_CHUNK_BYTES):
        chunk = data[start : start + DIGEST_CHUNK_BYTES]
        h.update(chunk)
        if after_chunk is not None:
            after_chunk(chunk)
    return h.hexdigest()[:16]


def digest_tree(
    obj, prefix: str, out: dict[str, str], digest: Callable[[torch.Tensor], str] = tensor_digest
) -> dict[str, str]:
    """Flatten nested state into {path: digest}; tensors by content (through `digest`, one at a time, so
    an engine can gather or page in each tensor only while it is hashed), other leaves by value."""
    if isinstance(obj, torch.Tensor):
        out[prefix] = digest(obj)
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            digest_tree(obj[key], f"{prefix}/{key}", out, digest)
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            digest_tree(item, f"{prefix}/{i}", out, digest)
    elif isinstance(obj, (int, float, str, bool, type(None))):
        out[prefix] = repr(obj)
    elif hasattr(obj, "__dict__"):
        digest_tree(vars(obj), f"{prefix}/{type(obj).__name__}", out, digest)
    else:
        out[prefix] = repr(obj)
    return out
