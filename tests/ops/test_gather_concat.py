"""gather_concat / capture_into: every backend equals the reference bit for bit.

CPU: the torch backend and the Triton kernels under the interpreter.
GPU (marked): the same cases on CUDA tensors for the triton and cuda backends.
"""

from __future__ import annotations

import logging

import pytest
import torch
from kernel_testutil import assert_bitwise_equal

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _ext, capture_into, describe_backends, gather_concat
from eagle3_backend.ops.reference import capture_into_ref, gather_concat_ref

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


def _sources(k: int, t: int, h: int, dtype: torch.dtype, device: str, scale: float = 4.0) -> list[torch.Tensor]:
    return [(torch.randn(t, h) * scale).to(dtype).to(device) for _ in range(k)]


def _naive(sources, index, dtype):
    """An independent statement of the op: index, concat, cast."""
    rows = [s if index is None else s[index.long()] for s in sources]
    return torch.cat(rows, dim=1).to(dtype)


def test_triton_config_choice():
    from eagle3_backend.ops.triton.gather_concat import pick_config

    assert pick_config(8192, 7168).block_h == 4096  # big launch: widest blocks
    assert pick_config(1, 7168).block_h == 256  # decode: many narrow programs
    assert pick_config(4096, 200).block_h == 256  # never wider than a row needs
    assert pick_config(4096, 576).block_h == 1024


def test_reference_matches_naive_statement():
    srcs = _sources(3, 9, 200, torch.bfloat16, "cpu")
    index = torch.tensor([8, 0, 8, 3])
    out = torch.empty(4, 600, dtype=torch.float32)
    assert_bitwise_equal(gather_concat_ref(srcs, index, out), _naive(srcs, index, torch.float32), "ref")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [200, 576])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_gather_bitexact(backend, device, dtype, hidden, k):
    _need(backend, device)
    srcs = _sources(k, 11, hidden, dtype, device)
    index = torch.tensor([10, 3, 3, 0, 7, 3], device=device)  # repeats
    out = gather_concat(srcs, index, backend=backend)
    assert out.shape == (6, k * hidden)
    assert_bitwise_equal(out, _naive([s.cpu() for s in srcs], index.cpu(), dtype), f"{backend} K={k} H={hidden}")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gather_single_row_wide_hidden(backend, device, dtype):
    """N=1 and H=7168 (Kimi-K2 / DeepSeek-V3) with a small T."""
    _need(backend, device)
    srcs = _sources(3, 3, 7168, dtype, device)
    index = torch.tensor([2], dtype=torch.int32, device=device)
    out = gather_concat(srcs, index, backend=backend)
    assert_bitwise_equal(out, _naive([s.cpu() for s in srcs], index.cpu(), dtype), backend)


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
@pytest.mark.parametrize("in_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
def test_gather_out_dtype_cast(backend, device, in_dtype, out_dtype):
    _need(backend, device)
    srcs = _sources(3, 5, 200, in_dtype, device, scale=1000.0)
    index = torch.tensor([4, 1, 1], dtype=torch.int64, device=device)
    out = gather_concat(srcs, index, out_dtype=out_dtype, backend=backend)
    assert_bitwise_equal(out, _naive([s.cpu() for s in srcs], index.cpu(), out_dtype), f"{in_dtype}->{out_dtype}")


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
def test_gather_special_values_cast(backend, device, in_dtype, out_dtype):
    _need(backend, device)
    row = _special_values(in_dtype)
    width = 32
    padded = torch.zeros(width, dtype=in_dtype)
    padded[: row.numel()] = row
    srcs = [padded.unsqueeze(0).repeat(2, 1).to(device), (-padded).unsqueeze(0).repeat(2, 1).to(device)]
    out = gather_concat(srcs, None, out_dtype=out_dtype, backend=backend)
    assert_bitwise_equal(out, _naive([s.cpu() for s in srcs], None, out_dtype), f"{in_dtype}->{out_dtype}")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_gather_stacked_form_and_no_index(backend, device):
    _need(backend, device)
    stacked = torch.randn(3, 6, 200).to(torch.bfloat16).to(device)  # [K, T, H]
    out = gather_concat(stacked, backend=backend)
    assert_bitwise_equal(out, _naive(list(stacked.cpu().unbind(0)), None, torch.bfloat16), "stacked")
    index = torch.tensor([5, 5, 1], device=device)
    listed = gather_concat(list(stacked.unbind(0)), index, backend=backend)
    assert_bitwise_equal(gather_concat(stacked, index, backend=backend), listed, "stacked vs list")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_gather_into_out_views_and_many_sources(backend, device):
    """A preallocated out that is a column slice of a wider buffer, and K=9
    (more sources than one Triton/CUDA launch takes)."""
    _need(backend, device)
    srcs = _sources(9, 7, 24, torch.float16, device)
    index = torch.tensor([6, 0, 2], device=device)
    wide = torch.full((3, 9 * 24 + 8), 7.0, dtype=torch.float16, device=device)
    out = wide[:, 8:]
    result = gather_concat(srcs, index, out=out, backend=backend)
    assert result.data_ptr() == out.data_ptr()
    assert_bitwise_equal(out, _naive([s.cpu() for s in srcs], index.cpu(), torch.float16), "K=9 into slice")
    assert torch.all(wide[:, :8] == 7.0), "wrote outside out"


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_gather_strided_sources(backend, device):
    """Sources that are column slices of a wider buffer (row stride != H)."""
    _need(backend, device)
    base = torch.randn(5, 3 * 208).to(torch.bfloat16).to(device)
    srcs = [base[:, k * 208 : k * 208 + 200] for k in range(3)]
    index = torch.tensor([4, 0], device=device)
    out = gather_concat(srcs, index, backend=backend)
    assert_bitwise_equal(out, _naive([s.cpu() for s in srcs], index.cpu(), torch.bfloat16), "strided")


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_gather_empty_index(backend, device):
    _need(backend, device)
    srcs = _sources(2, 4, 16, torch.float32, device)
    out = gather_concat(srcs, torch.empty(0, dtype=torch.int64, device=device), backend=backend)
    assert out.shape == (0, 32)


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
def test_capture_then_gather_equals_cat(backend, device):
    """Capturing K layers into the packed buffer, then gathering accepted
    rows, gives torch.cat([h_k + r_k])[index]: the SGLang packing contract."""
    _need(backend, device)
    rows, width, k = 6, 576, 3
    hiddens = _sources(k, rows, width, torch.bfloat16, device)
    residuals = _sources(k, rows, width, torch.bfloat16, device)
    buffer = torch.empty(rows, k * width, dtype=torch.bfloat16, device=device)
    for slot in range(k):
        capture_into(buffer, slot, hiddens[slot], residuals[slot], backend=backend)
    index = torch.tensor([5, 2, 2], device=device)
    packed = gather_concat([buffer], index, backend=backend)
    expected = torch.cat([h.cpu() + r.cpu() for h, r in zip(hiddens, residuals)], dim=1)[index.cpu()]
    assert_bitwise_equal(packed, expected, "capture+gather")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_capture_and_gather_replay_in_a_cuda_graph(backend):
    """SGLang runs the target's decode forward, captures included, as a CUDA
    graph: both ops must record without a host sync or an allocation and,
    replayed on new inputs in the same buffers, give the new answer."""
    _need(backend, "cuda")
    rows, width, k, accepted = 8, 7168, 3, 5
    hiddens = [torch.empty(rows, width, dtype=torch.bfloat16, device="cuda") for _ in range(k)]
    residuals = [torch.empty_like(h) for h in hiddens]
    buffer = torch.empty(rows, k * width, dtype=torch.bfloat16, device="cuda")
    index = torch.empty(accepted, dtype=torch.int64, device="cuda")
    out = torch.empty(accepted, k * width, dtype=torch.bfloat16, device="cuda")

    def step():
        for slot in range(k):
            capture_into(buffer, slot, hiddens[slot], residuals[slot], backend=backend)
        gather_concat([buffer], index, out=out, backend=backend)

    def fill(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        for t in (*hiddens, *residuals):
            t.copy_((torch.randn(rows, width, generator=gen) * 4).to(torch.bfloat16))
        index.copy_(torch.randint(0, rows, (accepted,), generator=gen))
        return torch.cat([h.cpu() + r.cpu() for h, r in zip(hiddens, residuals)], dim=1)[index.cpu()]

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
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out, expected, f"{backend} graph replay, inputs of seed {seed}")


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
    srcs = _sources(2, 4, 8, torch.float32, "cpu")
    cases = [
        (lambda: gather_concat([srcs[0], torch.zeros(4, 9)], backend=backend), "sources[1] has shape"),
        (lambda: gather_concat([srcs[0], torch.zeros(5, 8)], backend=backend), "sources[1] has shape"),
        (lambda: gather_concat([srcs[0], srcs[1].half()], backend=backend), "sources[1] is torch.float16"),
        (lambda: gather_concat([srcs[0], srcs[1].to("meta")], backend=backend), "sources[1] is on meta"),
        (lambda: gather_concat(srcs, torch.tensor([0.0]), backend=backend), "index must be int32 or int64"),
        (lambda: gather_concat(srcs, torch.tensor([[0]]), backend=backend), "index must be 1-D"),
        (lambda: gather_concat(srcs, torch.tensor([0, 4]), backend=backend), "index holds 4, outside [0, 4)"),
        (lambda: gather_concat(srcs, torch.tensor([-1]), backend=backend), "index holds -1"),
        (lambda: gather_concat(srcs, torch.tensor([0], device="meta"), backend=backend), "index is on meta"),
        (lambda: gather_concat(srcs, out=torch.empty(4, 15), backend=backend), "out must be [N, K*H] = [4, 16]"),
        (lambda: gather_concat(srcs, out=torch.empty(4, 16), out_dtype=torch.float16, backend=backend),
         "out is torch.float32 but the result is torch.float16"),
        (lambda: gather_concat(srcs[0], backend=backend), "must be [K, T, H]"),
        (lambda: gather_concat([], backend=backend), "sources is empty"),
        (lambda: capture_into(torch.empty(4, 17), 0, srcs[0], backend=backend), "not a multiple of hidden's width 8"),
        (lambda: capture_into(torch.empty(4, 16), 2, srcs[0], backend=backend), "slot must be in [0, 2), got 2"),
        (lambda: capture_into(torch.empty(3, 16), 0, srcs[0], backend=backend), "buffer has 3 rows but hidden has 4"),
        (lambda: capture_into(torch.empty(4, 16), 0, srcs[0], srcs[1].half(), backend=backend),
         "residual is torch.float16"),
    ]
    for call, message in cases:
        with pytest.raises(KernelError) as info:
            call()
        assert message in str(info.value), f"expected {message!r} in {str(info.value)!r}"


def test_unsupported_dtype_auto_falls_back_explicit_raises():
    srcs = [torch.randn(3, 4, dtype=torch.float64) for _ in range(2)]
    out = gather_concat(srcs, torch.tensor([1]))
    assert_bitwise_equal(out, _naive(srcs, torch.tensor([1]), torch.float64), "float64 auto")
    with pytest.raises(KernelError, match="backend='triton' cannot run this call: dtype torch.float64"):
        gather_concat(srcs, backend="triton")


# ---- dispatch ----------------------------------------------------------------------------


def test_dispatch_auto_and_env(monkeypatch, caplog):
    assert describe_backends("cpu")["gather_concat"]["backend"] == "triton"  # TRITON_INTERPRET=1 here
    monkeypatch.delenv("TRITON_INTERPRET")
    described = describe_backends("cpu")
    assert set(described) == {"gather_concat", "capture_into", "verify_tree_greedy"}
    assert described["gather_concat"]["backend"] == "torch"
    assert "TRITON_INTERPRET is not set" in described["gather_concat"]["reason"]
    assert "cuda: tensors are on cpu" in described["gather_concat"]["reason"]

    monkeypatch.setenv("EAGLE3_KERNEL_BACKEND", "bogus")
    with pytest.raises(KernelError, match="'bogus' is not a kernel backend"):
        gather_concat([torch.zeros(2, 4)])
    monkeypatch.setenv("EAGLE3_KERNEL_BACKEND", "cuda")  # cannot run on CPU: warn, fall back, same result
    srcs = _sources(2, 4, 8, torch.bfloat16, "cpu")
    with caplog.at_level(logging.WARNING):
        out = gather_concat(srcs, torch.tensor([3, 1]))
    assert_bitwise_equal(out, _naive(srcs, torch.tensor([3, 1]), torch.bfloat16), "env fallback")
    assert any("EAGLE3_KERNEL_BACKEND=cuda cannot run gather_concat" in r.message for r in caplog.records)
    with pytest.raises(KernelError, match="backend='cuda' cannot run this call: tensors are on cpu"):
        gather_concat(srcs, backend="cuda")


def test_non_unit_inner_stride_goes_to_torch():
    base = torch.randn(4, 8, 2)
    src = base[:, :, 0]  # inner stride 2
    out = gather_concat([src, src], torch.tensor([2]))  # auto: triton would be first, torch takes it
    assert_bitwise_equal(out, _naive([src, src], torch.tensor([2]), torch.float32), "strided inner")
    with pytest.raises(KernelError, match="inner stride 2"):
        gather_concat([src, src], backend="triton")
