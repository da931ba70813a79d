// Few-row linear layers for SGLang's CPU engine: out[M, N] = x[M, K] . W[N, K]^T (+ bias).
//
// A decode step multiplies one row, a 4-token verify or a top-k draft step a few. At
// such M the product should cost what streaming W from memory costs, yet BLAS GEMMs
// pack W (or read a prepacked copy) and at M = 4 run up to twice as long as the
// matrix-vector product at M = 1. This kernel reads each row of W once (two rows at a
// time, four with AVX-512 and more than one x row) and dots it with up to eight rows of x
// in the same pass (see kPassRows; x stays in L1), with FMA on one vector register per
// (x row, W row):
// AVX-512 where the building machine has it, else AVX2, else plain C++.
//
// W streams from memory with software prefetches 16 KB ahead into L2. On the 2-core VM
// this project measures on, a prefetch 2 KB ahead into L1 left the stream latency-bound
// (one row about MKL's matrix-vector product's time); 16 KB ahead, SmolLM2-135M's linear
// weights and LM head (538 MB fp32, one thread) take 0.48x of MKL's time for one row and
// 0.57x for 6 (benchmarks/bench_small_gemm.py, docs/cpu-engine.md).
//
// Summation order: element (m, n) is the same fixed-order dot product of x[m] and W[n]
// (V lanes over K in steps of V, a fixed lane reduction, then the K % V tail, all with
// fused multiply-adds) whatever M is and whichever other rows share the call, so a
// token's outputs do not depend on how many tokens are multiplied with it: a 4-token
// verify and a 1-token decode give bit-identical rows for the same inputs.
//
// x and out are fp32. W is fp32, or bf16 (``small_linear_bf16w``): a weight held in bf16
// because it is exactly representable there (a bf16 checkpoint served at fp32) is widened
// to fp32 in registers (a 16-bit shift, exact) and multiplied in the same order, so the
// result equals the fp32 kernel on the widened weight bit for bit while half the bytes
// stream from memory.
//
// Built on first use by eagle3_backend.cpu.small_gemm (torch JIT with
// -O3 -march=native: it runs on the machine that built it).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define E3_HAVE_AVX2 1
#else
#define E3_HAVE_AVX2 0
#endif

namespace {

constexpr int64_t kMaxRows = 16;
constexpr int64_t kPrefetchBytes = 16384;  // ahead of the loads in each W row, into L2
using bf16_t = uint16_t;                   // bf16 bits: the high half of an fp32

inline float widen(float v) { return v; }
inline float widen(bf16_t v) {
  const uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if E3_HAVE_AVX2
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);                      // 4 lanes
  __m128 sh = _mm_movehl_ps(lo, lo);            // lanes 2,3
  lo = _mm_add_ps(lo, sh);                      // 2 lanes
  sh = _mm_shuffle_ps(lo, lo, 0x55);            // lane 1
  return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}

#if defined(__AVX512F__)
#define E3_VEC 16
using vec_t = __m512;
inline vec_t vzero() { return _mm512_setzero_ps(); }
inline vec_t vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec_t vfma(vec_t a, vec_t b, vec_t c) { return _mm512_fmadd_ps(a, b, c); }
inline vec_t vload(const bf16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline float vsum(vec_t v) { return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1))); }
#else
#define E3_VEC 8
using vec_t = __m256;
inline vec_t vzero() { return _mm256_setzero_ps(); }
inline vec_t vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec_t vload(const bf16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline vec_t vfma(vec_t a, vec_t b, vec_t c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(vec_t v) { return hsum(v); }
#endif

// out[m * ldo + j] = dot(x[m], w[j]) for j < NR W rows and m < MR x rows.
template <int MR, int NR, typename T>
inline void block(const T* __restrict w, int64_t ldw, const float* __restrict x,
                  int64_t ldx, int64_t K, float* __restrict out, int64_t ldo) {
  constexpr int64_t kPrefetch = kPrefetchBytes / int64_t(sizeof(T));
  vec_t acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = vzero();
  const int64_t Kv = K - K % E3_VEC;
  for (int64_t k = 0; k < Kv; k += E3_VEC) {
    vec_t wv[NR];
    for (int j = 0; j < NR; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(w + j * ldw + k + kPrefetch), _MM_HINT_T1);
      wv[j] = vload(w + j * ldw + k);
    }
    for (int m = 0; m < MR; ++m) {
      const vec_t xv = vload(x + m * ldx + k);
      for (int j = 0; j < NR; ++j) acc[m][j] = vfma(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) {
      float s = vsum(acc[m][j]);
      for (int64_t k = Kv; k < K; ++k) s = std::fma(x[m * ldx + k], widen(w[j * ldw + k]), s);
      out[m * ldo + j] = s;
    }
}

// x rows per pass over NR W rows: the MR * NR accumulators, NR W vectors and an x vector must
// fit the registers (32 with AVX-512, 16 with AVX2). With AVX-512 and more than one x row a
// step takes four W rows, six x rows a pass: 24 FMAs for 10 loads, where two W rows take 12
// for 14 and the loads, not the FMAs, set the pace (12-16 rows in 0.80-0.94x the time,
// docs/cpu-engine.md). Each element's sum is the same whatever NR and MR.
#if defined(__AVX512F__)
template <int NR> constexpr int kPassRows = NR == 4 ? 6 : 8;
constexpr int64_t kWideRows = 4;
#else
template <int NR> constexpr int kPassRows = 4;
constexpr int64_t kWideRows = 2;
#endif

template <int NR, typename T>
inline void rows_block(const T* w, int64_t ldw, const float* x, int64_t M, int64_t K,
                       float* out, int64_t N) {
  constexpr int P = kPassRows<NR>;
  int64_t m = 0;
  for (; m + P <= M; m += P)
    block<P, NR, T>(w, ldw, x + m * K, K, K, out + m * N, N);
#define E3_ROWS(R) \
  case R:          \
    if constexpr (R < P) block<R, NR, T>(w, ldw, x + m * K, K, K, out + m * N, N); \
    break;
  switch (M - m) {
    E3_ROWS(1) E3_ROWS(2) E3_ROWS(3) E3_ROWS(4) E3_ROWS(5) E3_ROWS(6) E3_ROWS(7)
    default: break;
  }
#undef E3_ROWS
}
#endif

template <typename T>
void gemm(const float* x, const T* w, const float* bias, float* out, int64_t M, int64_t N,
          int64_t K) {
#if E3_HAVE_AVX2
  // W rows a task's step takes: with seven or eight x rows two, so that one pass takes all
  // the x rows (kPassRows<2>); four would take them in two passes, six rows and then one or
  // two, the second re-reading the W rows for few FMAs a load
  const int64_t step = M > 1 && (M <= kPassRows<kWideRows> || M > kPassRows<2>) ? kWideRows : 2;
#else
  const int64_t step = 2;
#endif
  // a task streams about 64 KB of W, in whole steps
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1) / step);
  at::parallel_for(0, (N + step - 1) / step, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = step * p, end = std::min(n + step, N);
#if E3_HAVE_AVX2
      if (kWideRows == 4 && end - n == 4)
        rows_block<kWideRows, T>(w + n * K, K, x, M, K, out + n, N);
      else
        for (int64_t j = n; j < end; j += 2) {
          if (j + 2 <= end) rows_block<2, T>(w + j * K, K, x, M, K, out + j, N);
          else rows_block<1, T>(w + j * K, K, x, M, K, out + j, N);
        }
#else
      for (int64_t j = n; j < end; ++j)
        for (int64_t m = 0; m < M; ++m) {
          float s = 0.f;
          for (int64_t k = 0; k < K; ++k) s = std::fma(x[m * K + k], widen(w[j * K + k]), s);
          out[m * N + j] = s;
        }
#endif
      if (bias != nullptr)
        for (int64_t j = n; j < end; ++j)
          for (int64_t m = 0; m < M; ++m) out[m * N + j] += bias[j];
    }
  });
}

}  // namespace

static torch::Tensor few_row_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                    const c10::optional<torch::Tensor>& bias, at::ScalarType wtype) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(),
              "small_linear: x and weight must be CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == wtype,
              "small_linear: x must be float32 and weight ", wtype, ", got ", x.scalar_type(),
              " and ", weight.scalar_type());
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "small_linear: x must be [M, K] and weight [N, K]");
  TORCH_CHECK(x.size(1) == weight.size(1), "small_linear: x has ", x.size(1),
              " columns, weight has ", weight.size(1));
  const int64_t M = x.size(0), N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "small_linear: needs 1..", kMaxRows, " rows, got ", M);
  const float* b = nullptr;
  torch::Tensor bc;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N,
                "small_linear: bias must be float32 [", N, "]");
    bc = bias->contiguous();
    b = bc.data_ptr<float>();
  }
  auto xc = x.contiguous();
  auto wc = weight.contiguous();
  auto out = torch::empty({M, N}, x.options());
  if (wtype == at::kBFloat16)
    gemm(xc.data_ptr<float>(), reinterpret_cast<const bf16_t*>(wc.data_ptr<at::BFloat16>()), b,
         out.data_ptr<float>(), M, N, K);
  else
    gemm(xc.data_ptr<float>(), wc.data_ptr<float>(), b, out.data_ptr<float>(), M, N, K);
  return out;
}

torch::Tensor small_linear(const torch::Tensor& x, const torch::Tensor& weight,
                           const c10::optional<torch::Tensor>& bias) {
  return few_row_linear(x, weight, bias, at::kFloat);
}

torch::Tensor small_linear_bf16w(const torch::Tensor& x, const torch::Tensor& weight,
                                 const c10::optional<torch::Tensor>& bias) {
  return few_row_linear(x, weight, bias, at::kBFloat16);
}

bool has_avx2() { return E3_HAVE_AVX2; }

// kernels/paged_attention.cpp and kernels/layer_ops.cpp, built into this module, add their
// functions to it
void register_paged_attention(pybind11::module_& m);
void register_layer_ops(pybind11::module_& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("small_linear", &small_linear, "out[M, N] = x[M, K] W[N, K]^T + bias; fp32, M <= 16");
  m.def("small_linear_bf16w", &small_linear_bf16w,
        "small_linear with a bf16 weight widened exactly to fp32: equals small_linear(x, "
        "weight.float(), bias) bit for bit");
  m.def("has_avx2", &has_avx2, "whether the kernel was built with AVX2 + FMA");
  register_paged_attention(m);
  register_layer_ops(m);
  m.attr("max_rows") = kMaxRows;
}
