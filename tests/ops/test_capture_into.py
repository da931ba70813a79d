"""capture_into: every backend equals the reference bit for bit.

CPU: the torch backend and the Triton kernel under the interpreter.
GPU (marked): the same cases on CUDA tensors for the triton and cuda backends.
"""

from __future__ import annotations

import logging

import pytest
import torch
from kernel_testutil import assert_bitwise_equal

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _ext, capture_into, describe_backends
from eagle3_backend.ops.reference import capture_into_ref

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
CPU_BACKENDS = ("torch", "triton")


def _gpu_backends() -> list:
    marks = [pytest.mark.gpu]
    return [
        pytest.param("triton", "cuda", marks=marks, id="triton-cuda"),
        pytest.param("cuda", "cuda", marks=marks, id="cuda-cuda"),
    ]


BACKEND_DEVICES = [pytest.param(b, "cpu", id=f"{b}-cpu") for b in CPU_BACKENDS] + _gpu_backends()


def _need(backend: str, device: str) -> None:
    if device == "cuda" and backend == "cuda" and not _ext.available():
        if not _ext.jit_build():
            pytest.fail(f"CUDA extension unavailable on a GPU machine: {_ext.load_error()}")


def _states(k: int, t: int, h: int, dtype: torch.dtype, device: str, scale: float = 4.0) -> list[torch.Tensor]:
    return [(torch.randn(t, h) * scale).to(dtype).to(device) for _ in range(k)]


def _packed(hiddens, residuals, dtype):
    """An independent statement of K captures: torch.cat of the model's own sums, cast."""
    sums = [h.cpu() if r is None else h.cpu() + r.cpu() for h, r in zip(hiddens, residuals)]
    return torch.cat(sums, dim=1).to(dtype)


def test_triton_config_choice():
    from eagle3_backend.ops.triton.capture_into import pick_config

    assert pick_config(8192, 7168).block_h == 4096  # big launch: widest blocks
    assert pick_config(1, 7168).block_h == 256  # decode: many narrow programs
    assert pick_config(4096, 200).block_h == 256  # never wider than a row needs
    assert pick_config(4096, 576).block_h == 1024


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("in_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
def test_capture_into_bitexact(backend, device, in_dtype, out_dtype):
    _need(backend, device)
    rows, width, slots = 5, 200, 3
    hidden = (torch.randn(rows, width) * 8).to(in_dtype).to(device)
    residual = (torch.randn(rows, width) * 8).to(in_dtype).to(device)
    buffer = torch.full((rows, slots * width), -3.0, dtype=out_dtype, device=device)
    capture_into(buffer, 1, hidden, residual, backend=backend)
    expected = torch.full((rows, slots * width), -3.0, dtype=out_dtype)
    expected[:, width : 2 * width] = (hidden.cpu() + residual.cpu()).to(out_dtype)
    assert_bitwise_equal(buffer, expected, f"{in_dtype}->{out_dtype} residual")
    capture_into(buffer, 2, hidden, None, backend=backend)
    expected[:, 2 * width :] = hidden.cpu().to(out_dtype)
    assert_bitwise_equal(buffer, expected, f"{in_dtype}->{out_dtype} copy")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [200, 576, 7168])
@pytest.mark.parametrize("k", [1, 3, 4])
def test_k_captures_in_any_order_equal_the_concat(backend, device, dtype, hidden, k):
    """K layers written slot by slot, last slot first (a layout out of layer order),
    H up to 7168 (Kimi-K2 / DeepSeek-V3): the buffer is torch.cat of the sums."""
    _need(backend, device)
    rows = 3 if hidden == 7168 else 11
    hiddens, residuals = _states(k, rows, hidden, dtype, device), _states(k, rows, hidden, dtype, device)
    buffer = torch.empty(rows, k * hidden, dtype=dtype, device=device)
    for slot in reversed(range(k)):
        capture_into(buffer, slot, hiddens[slot], residuals[slot], backend=backend)
    assert_bitwise_equal(buffer, _packed(hiddens, residuals, dtype), f"{backend} K={k} H={hidden}")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("rows", [1, 40, 1024])
@pytest.mark.parametrize("hidden", [576, 4100, 7168])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_decode_and_prefill_launch_plans(backend, rows, hidden, dtype):
    """Both launch shapes of each kernel: few rows spread over many small blocks (decode),
    1,024 rows in whole-row blocks (prefill). The inputs are views of rows padded to a
    multiple of 64, so the rows start 16-byte aligned: in bf16, H = 4100 then takes the
    vector path with a 4-element tail in slot 0, and the element path in slot 1 (its first
    column is not 16-byte aligned)."""
    _need(backend, "cuda")
    padded = -(-hidden // 64) * 64

    def views() -> list[torch.Tensor]:
        return [torch.zeros(rows, padded, dtype=dtype, device="cuda")[:, :hidden].copy_(t)
                for t in _states(2, rows, hidden, dtype, "cuda")]

    hiddens, residuals = views(), views()
    assert hiddens[0].stride(0) == padded
    buffer = torch.full((rows, 2 * hidden), float("nan"), dtype=dtype, device="cuda")
    for slot in (1, 0):
        capture_into(buffer, slot, hiddens[slot], residuals[slot], backend=backend)
    assert_bitwise_equal(buffer, _packed(hiddens, residuals, dtype), f"{backend} rows={rows} H={hidden}")


def _special_values(dtype: torch.dtype) -> torch.Tensor:
    """Zeros of both signs, subnormals, infinities, extremes and rounding ties."""
    finfo = torch.finfo(dtype)
    values = [0.0, -0.0, float("inf"), float("-inf"), finfo.max, -finfo.max, finfo.tiny, finfo.smallest_normal / 4,
              -finfo.tiny / 8, 1.0, -1.0, 65504.0 if dtype != torch.float16 else 1.5]
    wide = torch.tensor(values, dtype=torch.float64).to(dtype)
    if dtype == torch.float32:  # exact ties and near-ties for rounding to bf16 and fp16
        ties = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x00008000,
                             0x3F801000, 0x3F803000, 0x47800000, 0x477FF000, 0x387FC000, 0x33800000],
                            dtype=torch.int32).view(torch.float32)
        wide = torch.cat([wide, ties])
    return wide


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # numpy, in the interpreter
@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("in_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
def test_special_values_cast(backend, device, in_dtype, out_dtype):
    """The cast into the buffer rounds like Tensor.to, specials included; with a zero
    residual the sum keeps every special value (-0.0 + 0.0 is +0.0, as in torch)."""
    _need(backend, device)
    row = _special_values(in_dtype)
    padded = torch.zeros(32, dtype=in_dtype)
    padded[: row.numel()] = row
    hidden = torch.stack([padded, -padded]).to(device)
    zeros = torch.zeros_like(hidden)
    buffer = torch.empty(2, 64, dtype=out_dtype, device=device)
    capture_into(buffer, 0, hidden, None, backend=backend)
    capture_into(buffer, 1, hidden, zeros, backend=backend)
    assert_bitwise_equal(buffer, _packed([hidden, hidden], [None, zeros], out_dtype), f"{in_dtype}->{out_dtype}")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_strided_rows_and_a_buffer_slice(backend, device):
    """hidden / residual that are column slices of wider tensors (row stride != H) and a
    buffer that is a column slice of a wider one: nothing outside the slot is written."""
    _need(backend, device)
    base = torch.randn(5, 2 * 208).to(torch.bfloat16).to(device)
    hidden, residual = base[:, :200], base[:, 208:408]
    wide = torch.full((5, 2 * 200 + 8), 7.0, dtype=torch.bfloat16, device=device)
    buffer = wide[:, 8:]
    result = capture_into(buffer, 1, hidden, residual, backend=backend)
    assert result.data_ptr() == buffer.data_ptr()
    assert_bitwise_equal(buffer[:, 200:], (hidden.cpu() + residual.cpu()), "strided")
    assert torch.all(wide[:, :208] == 7.0), "wrote outside the slot"


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_no_rows(backend, device):
    _need(backend, device)
    buffer = torch.empty(0, 32, device=device)
    assert capture_into(buffer, 1, torch.empty(0, 16, device=device), backend=backend) is buffer


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_capture_replays_in_a_cuda_graph(backend):
    """SGLang runs the target's decode forward, captures included, as a CUDA
    graph: the op must record without a host sync or an allocation and,
    replayed on new inputs in the same buffers, give the new answer."""
    _need(backend, "cuda")
    rows, width, k = 8, 7168, 3
    hiddens = [torch.empty(rows, width, dtype=torch.bfloat16, device="cuda") for _ in range(k)]
    residuals = [torch.empty_like(h) for h in hiddens]
    buffer = torch.empty(rows, k * width, dtype=torch.bfloat16, device="cuda")

    def step():
        for slot in range(k):
            capture_into(buffer, slot, hiddens[slot], residuals[slot], backend=backend)

    def fill(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        for t in (*hiddens, *residuals):
            t.copy_((torch.randn(rows, width, generator=gen) * 4).to(torch.bfloat16))
        return _packed(hiddens, residuals, torch.bfloat16)

    fill(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first calls compile / load outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in (1, 2):
        expected = fill(seed)
        buffer.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(buffer, expected, f"{backend} graph replay, inputs of seed {seed}")


def test_capture_into_reference_rounds_like_model_sum():
    hidden = torch.randn(3, 8).to(torch.bfloat16)
    residual = torch.randn(3, 8).to(torch.bfloat16)
    buffer = torch.zeros(3, 16, dtype=torch.float32)
    capture_into_ref(buffer, 0, hidden, residual)
    # The model's residual stream is the bf16 sum; widening it must not change it.
    assert_bitwise_equal(buffer[:, :8], (hidden + residual).float(), "ref")


# ---- errors: clear messages, same on every backend -------------------------------------


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_errors_name_the_problem(backend):
    hidden, other = _states(2, 4, 8, torch.float32, "cpu")
    cases = [
        (lambda: capture_into(torch.empty(4, 17), 0, hidden, backend=backend), "not a multiple of hidden's width 8"),
        (lambda: capture_into(torch.empty(4, 16), 2, hidden, backend=backend), "slot must be in [0, 2), got 2"),
        (lambda: capture_into(torch.empty(3, 16), 0, hidden, backend=backend), "buffer has 3 rows but hidden has 4"),
        (lambda: capture_into(torch.empty(4, 16), 0, hidden, other.half(), backend=backend),
         "residual is torch.float16"),
        (lambda: capture_into(torch.empty(4, 16), 0, hidden, other[:, :4], backend=backend),
         "residual has shape (4, 4) but hidden has (4, 8)"),
        (lambda: capture_into(torch.empty(4, 16), 0, hidden[0], backend=backend), "hidden must be a 2-D tensor"),
        (lambda: capture_into(torch.empty(64), 0, hidden, backend=backend), "buffer must be a 2-D tensor"),
        (lambda: capture_into(torch.empty(4, 16), 0, hidden.to("meta"), backend=backend), "hidden is on meta"),
    ]
    for call, message in cases:
        with pytest.raises(KernelError) as info:
            call()
        assert message in str(info.value), f"expected {message!r} in {str(info.value)!r}"


def test_unsupported_dtype_auto_falls_back_explicit_raises():
    hidden = torch.randn(3, 4, dtype=torch.float64)
    buffer = capture_into(torch.zeros(3, 8, dtype=torch.float64), 1, hidden, hidden)
    assert_bitwise_equal(buffer[:, 4:], hidden + hidden, "float64 auto")
    with pytest.raises(KernelError, match="backend='triton' cannot run this call: dtype torch.float64"):
        capture_into(torch.zeros(3, 8, dtype=torch.float64), 1, hidden, backend="triton")


# ---- dispatch ----------------------------------------------------------------------------


def test_dispatch_auto_and_env(monkeypatch, caplog):
    assert describe_backends("cpu")["capture_into"]["backend"] == "triton"  # TRITON_INTERPRET=1 here
    monkeypatch.delenv("TRITON_INTERPRET")
    described = describe_backends("cpu")
    assert set(described) == {"capture_into", "verify_tree_greedy"}
    assert described["capture_into"]["backend"] == "torch"
    assert "TRITON_INTERPRET is not set" in described["capture_into"]["reason"]
    assert "cuda: tensors are on cpu" in described["capture_into"]["reason"]

    hidden = _states(1, 4, 8, torch.bfloat16, "cpu")[0]
    monkeypatch.setenv("EAGLE3_KERNEL_BACKEND", "bogus")
    with pytest.raises(KernelError, match="'bogus' is not a kernel backend"):
        capture_into(torch.zeros(4, 8), 0, torch.zeros(4, 8))
    monkeypatch.setenv("EAGLE3_KERNEL_BACKEND", "cuda")  # cannot run on CPU: warn, fall back, same result
    with caplog.at_level(logging.WARNING):
        buffer = capture_into(torch.zeros(4, 16, dtype=torch.bfloat16), 1, hidden)
    assert_bitwise_equal(buffer[:, 8:], hidden, "env fallback")
    assert any("EAGLE3_KERNEL_BACKEND=cuda cannot run capture_into" in r.message for r in caplog.records)
    with pytest.raises(KernelError, match="backend='cuda' cannot run this call: tensors are on cpu"):
        capture_into(torch.zeros(4, 16, dtype=torch.bfloat16), 1, hidden, backend="cuda")


def test_non_unit_inner_stride_goes_to_torch():
    base = torch.randn(4, 8, 2)
    hidden = base[:, :, 0]  # inner stride 2
    buffer = capture_into(torch.zeros(4, 16), 1, hidden)  # auto: triton would be first, torch takes it
    assert_bitwise_equal(buffer[:, 8:], hidden.contiguous(), "strided inner")
    with pytest.raises(KernelError, match="inner stride 2"):
        capture_into(torch.zeros(4, 16), 1, hidden, backend="triton")
