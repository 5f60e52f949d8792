"""The lines with which an engine says it ran out of memory: one table, ``OUT_OF_MEMORY``.

A start that fails for memory (the budget said it fits, the driver disagreed: fragmentation, the
page cache on unified memory, another process) is retried once after the controller made room
(controller/decide.py, ``OomRetry``); any other failure is a failed start with backoff. What tells
the two apart is the engine's own output, which a failed start's reason carries (its last log
lines, deploy/ending.py). Each pattern is the line one engine or library writes, quoted in
tests/unit/test_oomlines.py with where it was seen; a line that merely talks about memory (a
flag, a buffer's size, a pinned-memory failure for another reason) must not match, since a
retry that cannot help only delays the failure a person needs to see.
"""

from __future__ import annotations

import re

OUT_OF_MEMORY: tuple[re.Pattern[str], ...] = (
    # PyTorch's caching allocator: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate
    # 50.00 MiB. GPU 0 has a total capacity of ..." (older: "RuntimeError: CUDA out of memory.").
    re.compile(r"CUDA out of memory\. Tried to allocate"),
    # The CUDA runtime's or driver's own error text, raised by torch or a custom op:
    # "RuntimeError: CUDA error: out of memory", "RuntimeError: CUDA driver error: out of memory".
    re.compile(r"CUDA (?:driver )?error: out of memory"),
    # cudaMalloc's failure as llama.cpp's CUDA backend logs it ("... cudaMalloc failed: out of
    # memory") and the runtime's error name where a program prints that instead.
    re.compile(r"cudaMalloc failed: out of memory|cudaErrorMemoryAllocation"),
    # The NVIDIA kernel driver's status (NVRM lines, and what reads them back).
    re.compile(r"\bNV_ERR_NO_MEMORY\b"),
    # vLLM: the weights fit, the KV cache does not ("ValueError: No available memory for the
    # cache blocks. Try increasing `gpu_memory_utilization` ...").
    re.compile(r"No available memory for the cache blocks"),
    # llama.cpp's allocators after a failed device allocation: "ggml_backend_cuda_buffer_type_
    # alloc_buffer: allocating 14136.04 MiB on device 0: cudaMalloc failed" (above), then
    # "alloc_tensor_range: failed to allocate CUDA0 buffer of size 151851674624" and "llama_model_
    # load: error loading model: unable to allocate CUDA0 buffer" (Metal, Vulkan: the same words).
    re.compile(r"failed to allocate \S+ buffer of size \d+|unable to allocate \S+ buffer\b"),
    re.compile(r"ggml_backend_\w+_buffer_type_alloc_buffer: allocating .* failed"),
)


def out_of_memory(output: str) -> str | None:
    """The first line of ``output`` (a failed start's reason and the engine's last lines) that
    says the engine ran out of memory, or None."""
    for line in output.splitlines():
        if any(pattern.search(line) for pattern in OUT_OF_MEMORY):
            return line.strip()
    return None
