"""The out-of-memory lines (dgxmm.deploy.oomlines) against lines engines really wrote, each with
where it was seen, and against lines that talk about memory without saying it ran out."""

from __future__ import annotations

import pytest

from dgxmm.deploy.oomlines import OUT_OF_MEMORY, out_of_memory

# (line, where it was seen)
REAL: list[tuple[str, str]] = [
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of "
        "23.56 GiB of which 21.75 MiB is free. Including non-PyTorch memory, this process has 23.50 GiB memory "
        "in use.",
        "vLLM's EngineCore under PyTorch 2.x, noonghunna/club-3090 issue 16",
    ),
    (
        "(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 50.00 MiB.",
        "the same line with vLLM's log prefix, noonghunna/club-3090 issue 16",
    ),
    (
        "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
        "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)",
        "older PyTorch, pytorch/pytorch issue 16417",
    ),
    (
        "(EngineCore pid=77) ERROR 05-05 07:35:19 [core.py:1136] RuntimeError: CUDA driver error: out of memory",
        "vLLM's gptq_marlin_repack at load, noonghunna/club-3090 issue 60",
    ),
    ("RuntimeError: CUDA error: out of memory", "torch raising the runtime's error, maybleMyers/H1111 issue 23"),
    (
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 144817.04 MiB on device 0: cudaMalloc failed: "
        "out of memory",
        "llama.cpp loading a model, ggml-org/llama.cpp issue 20431",
    ),
    (
        "alloc_tensor_range: failed to allocate CUDA0 buffer of size 151851674624",
        "the line after it, ggml-org/llama.cpp issue 20431",
    ),
    (
        "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        "the model load's end, ggml-org/llama.cpp issue 20431",
    ),
    (
        "ggml_gallocr_reserve_n: failed to allocate ROCm0 buffer of size 14822711296",
        "llama.cpp's compute buffers on ROCm, ggml-org/llama.cpp issue 16725",
    ),
    (
        "1.06.520.084 E ggml_gallocr_reserve_n_impl: failed to allocate CUDA1 buffer of size 54262464512",
        "llama-server with timestamps, ggml-org/llama.cpp pull request 26297",
    ),
    (
        "[52595.758098] NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) "
        "returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1353",
        "the kernel driver, NVIDIA/open-gpu-kernel-modules issue 848",
    ),
    (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        "vLLM's KV cache sizing, vllm-project/vllm issue 2248",
    ),
    (
        "Error: Couldn't allocate cuda array: cudaErrorMemoryAllocation:out of memory",
        "a CUDA program printing the runtime's error name, LizardByte/Sunshine issue 299",
    ),
]

# Lines around those failures, or in ordinary starts, that must not read as out of memory.
NOT: list[str] = [
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "llama_kv_cache_init:      CUDA0 KV buffer size =   379.23 MiB",
    "llm_load_tensors:      CUDA0 buffer size = 45460.59 MiB",
    "ggml_cuda_host_malloc: failed to allocate 1900,00 MiB of pinned memory: invalid argument",
    "INFO 03-10 08:07:20 [gpu_model_runner.py:1067] Model loading took 0.2389 GB and 0.977005 seconds",
    "python -m vllm.entrypoints.openai.api_server --model bigscience/bloom-560m --gpu-memory-utilization 0.95",
    "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "simulated start failure: --fail-start was given",
    "the engine exited with code 1 before it was ready",
    "OSError: [Errno 98] Address already in use",
    "x needs 8 GiB, more than the 6.0 GiB on-demand models can get on this host",
]


@pytest.mark.parametrize(("line", "seen"), REAL, ids=[seen for _, seen in REAL])
def test_a_real_out_of_memory_line_is_found_in_a_failed_starts_output(line: str, seen: str) -> None:
    output = f"the engine exited with code 1 before it was ready\nINFO loading\n{line}\nINFO exiting"
    assert out_of_memory(output) == line.strip(), seen


@pytest.mark.parametrize("line", NOT)
def test_a_line_that_only_talks_about_memory_is_not_out_of_memory(line: str) -> None:
    assert out_of_memory(line) is None


def test_every_pattern_is_needed_by_a_real_line() -> None:
    """No pattern of the table is there without a real line it finds."""
    for pattern in OUT_OF_MEMORY:
        assert any(pattern.search(line) for line, _ in REAL), pattern.pattern
