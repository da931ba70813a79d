// The capture-time write of hidden + residual into one slot of the packed
// [T, K*H] fc-input buffer.
//
// grid = rows * tiles. Each thread moves UNROLL 16-byte vectors (loads first,
// then stores); the part of a row that is not a whole number of vectors is
// copied element by element by the row's last tile. A launch of fewer than
// kTargetBlocks blocks (decode sizes) moves one vector a thread in blocks of
// 32-128 threads instead, so a few rows spread over many SMs rather than
// queueing on the bandwidth of one (H200, CUDA graph replay, one row of 7,168
// bf16: 1.69 -> 1.37 us a capture; benchmarks/README.md). When some row start is not
// 16-byte aligned the launcher picks the element-wise kernel instead (same
// result, slower). Casts go through float with round-to-nearest-even, exactly
// like torch's Tensor.to.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "eagle3_kernels.h"

namespace eagle3 {
namespace {

constexpr int kUnroll = 4;
constexpr int kMaxThreads = 256;
// Blocks that keep a large GPU busy (RTX PRO 6000: 188 SMs, H100/H200: 132), as
// ops/triton/capture_into.py's picker counts programs.
constexpr int64_t kTargetBlocks = 4 * 188;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename TIn, typename TOut>
struct Convert {
  __device__ __forceinline__ static TOut run(TIn x) { return from_float<TOut>(to_float(x)); }
};
template <typename T>
struct Convert<T, T> {
  __device__ __forceinline__ static T run(T x) { return x; }
};

// Stores VEC converted elements with accesses of at most 16 bytes each.
template <typename TIn, typename TOut, int VEC>
__device__ __forceinline__ void store_converted(TOut* dst, const Pack<TIn, VEC>& in) {
  constexpr int kChunk = (VEC * sizeof(TOut) <= 16) ? VEC : static_cast<int>(16 / sizeof(TOut));
  static_assert(VEC % kChunk == 0, "vector must split into whole chunks");
#pragma unroll
  for (int c = 0; c < VEC / kChunk; ++c) {
    Pack<TOut, kChunk> out;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) out.v[i] = Convert<TIn, TOut>::run(in.v[c * kChunk + i]);
    reinterpret_cast<Pack<TOut, kChunk>*>(dst)[c] = out;
  }
}

template <typename TIn, typename TOut, int VEC, bool HAS_RESIDUAL, int UNROLL>
__global__ void __launch_bounds__(kMaxThreads)
    capture_into_kernel(const __grid_constant__ CaptureIntoParams p, int64_t tiles_per_row) {
  const int64_t row = blockIdx.x / tiles_per_row;
  const int64_t tile = blockIdx.x - row * tiles_per_row;
  const TIn* hid = static_cast<const TIn*>(p.hidden) + row * p.hidden_row_stride;
  const TIn* res = HAS_RESIDUAL ? static_cast<const TIn*>(p.residual) + row * p.residual_row_stride
                                : nullptr;
  TOut* dst = static_cast<TOut*>(p.buffer) + row * p.buffer_row_stride + p.col;

  const int64_t num_vec = p.hidden_size / VEC;
  const int64_t first = tile * static_cast<int64_t>(blockDim.x) * UNROLL + threadIdx.x;
  Pack<TIn, VEC> a[UNROLL];
  Pack<TIn, VEC> b[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t v = first + static_cast<int64_t>(u) * blockDim.x;
    if (v < num_vec) {
      a[u] = reinterpret_cast<const Pack<TIn, VEC>*>(hid)[v];
      if constexpr (HAS_RESIDUAL) b[u] = reinterpret_cast<const Pack<TIn, VEC>*>(res)[v];
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t v = first + static_cast<int64_t>(u) * blockDim.x;
    if (v < num_vec) {
      if constexpr (HAS_RESIDUAL) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          a[u].v[i] = from_float<TIn>(to_float(a[u].v[i]) + to_float(b[u].v[i]));
        }
      }
      store_converted<TIn, TOut, VEC>(dst + v * VEC, a[u]);
    }
  }
  if (tile == tiles_per_row - 1) {
    for (int64_t h = num_vec * VEC + threadIdx.x; h < p.hidden_size; h += blockDim.x) {
      TIn x = hid[h];
      if constexpr (HAS_RESIDUAL) x = from_float<TIn>(to_float(x) + to_float(res[h]));
      dst[h] = Convert<TIn, TOut>::run(x);
    }
  }
}

bool aligned(const void* ptr, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
}

// Threads, vectors a thread (unroll) and tiles for `rows` rows of num_vec vectors (plus a
// scalar tail): whole rows in blocks of up to 256 threads x 4 vectors, or, when that
// launches fewer than kTargetBlocks blocks, one vector a thread in blocks halved from 128
// down to 32 threads until the launch has kTargetBlocks blocks.
struct Plan {
  int threads;
  int unroll;
  int64_t tiles;
};

Plan plan(int64_t rows, int64_t hidden, int vec) {
  const int64_t num_vec = hidden / vec;
  const int64_t work = num_vec > 0 ? num_vec : (hidden > 0 ? 1 : 0);
  auto tiles_of = [&](int64_t per_tile) { return num_vec > 0 ? (num_vec + per_tile - 1) / per_tile : 1; };
  int64_t t = (work + kUnroll - 1) / kUnroll;
  t = ((t + 31) / 32) * 32;
  if (t < 32) t = 32;
  if (t > kMaxThreads) t = kMaxThreads;
  Plan wide{static_cast<int>(t), kUnroll, tiles_of(t * kUnroll)};
  if (rows * wide.tiles >= kTargetBlocks || num_vec <= 32) return wide;
  Plan narrow{128, 1, tiles_of(128)};
  while (narrow.threads > 32 && rows * narrow.tiles < kTargetBlocks) {
    narrow.threads /= 2;
    narrow.tiles = tiles_of(narrow.threads);
  }
  return narrow;
}

template <typename TIn, typename TOut, int VEC, int UNROLL>
void launch(const CaptureIntoParams& p, const Plan& plan, unsigned blocks, cudaStream_t stream) {
  if (p.residual != nullptr) {
    capture_into_kernel<TIn, TOut, VEC, true, UNROLL><<<blocks, plan.threads, 0, stream>>>(p, plan.tiles);
  } else {
    capture_into_kernel<TIn, TOut, VEC, false, UNROLL><<<blocks, plan.threads, 0, stream>>>(p, plan.tiles);
  }
}

template <typename TIn, typename TOut>
cudaError_t capture_typed(const CaptureIntoParams& p, int vec, cudaStream_t stream) {
  const Plan pl = plan(p.num_rows, p.hidden_size, vec);
  const int64_t blocks = p.num_rows * pl.tiles;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  constexpr int kVec = static_cast<int>(16 / sizeof(TIn));
  const unsigned g = static_cast<unsigned>(blocks);
  if (vec == kVec && pl.unroll == kUnroll) launch<TIn, TOut, kVec, kUnroll>(p, pl, g, stream);
  if (vec == kVec && pl.unroll == 1) launch<TIn, TOut, kVec, 1>(p, pl, g, stream);
  if (vec != kVec && pl.unroll == kUnroll) launch<TIn, TOut, 1, kUnroll>(p, pl, g, stream);
  if (vec != kVec && pl.unroll == 1) launch<TIn, TOut, 1, 1>(p, pl, g, stream);
  return cudaGetLastError();
}

// Calls F<TIn, TOut>(args...) for the runtime dtype pair.
template <template <typename, typename> class F, typename... Args>
cudaError_t dispatch_dtypes(DType in, DType out, Args&&... args) {
#define EAGLE3_OUT_CASES(TIN)                                                        \
  switch (out) {                                                                     \
    case DType::kFloat32: return F<TIN, float>::run(args...);                        \
    case DType::kFloat16: return F<TIN, __half>::run(args...);                       \
    case DType::kBFloat16: return F<TIN, __nv_bfloat16>::run(args...);               \
  }                                                                                  \
  return cudaErrorInvalidValue;
  switch (in) {
    case DType::kFloat32: { EAGLE3_OUT_CASES(float) }
    case DType::kFloat16: { EAGLE3_OUT_CASES(__half) }
    case DType::kBFloat16: { EAGLE3_OUT_CASES(__nv_bfloat16) }
  }
#undef EAGLE3_OUT_CASES
  return cudaErrorInvalidValue;
}

template <typename TIn, typename TOut>
struct CaptureFn {
  static cudaError_t run(const CaptureIntoParams& p, int vec, cudaStream_t s) {
    return capture_typed<TIn, TOut>(p, vec, s);
  }
};

}  // namespace

cudaError_t launch_capture_into(const CaptureIntoParams& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.hidden_size == 0) return cudaSuccess;
  const int in_size = dtype_size(p.in_dtype);
  const int out_size = dtype_size(p.out_dtype);
  const int vec = 16 / in_size;
  const int64_t out_bytes = vec * out_size < 16 ? vec * out_size : 16;
  bool ok = aligned(p.hidden, 16) && (p.hidden_row_stride * in_size) % 16 == 0;
  if (p.residual != nullptr) {
    ok = ok && aligned(p.residual, 16) && (p.residual_row_stride * in_size) % 16 == 0;
  }
  ok = ok && aligned(p.buffer, out_bytes) && (p.buffer_row_stride * out_size) % out_bytes == 0 &&
       (p.col * out_size) % out_bytes == 0;
  return dispatch_dtypes<CaptureFn>(p.in_dtype, p.out_dtype, p, ok ? vec : 1, stream);
}

}  // namespace eagle3
