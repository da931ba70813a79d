// Paged attention for SGLang's CPU engine, in one pass over the cache: the extend (prefill
// chunks, EAGLE-3 verify with its tree mask, draft extend) and the decode that SGLang's
// intel_amx attention backend asks of sgl_kernel's extend_attention_cpu and
// decode_attention_cpu, for the shapes a served step has: a few queries per request over a
// few hundred or thousand keys. The torch implementation in ops/attention.py gathers each
// request's keys and values into new tensors and runs a dozen small ops a layer; at one
// query per request that is most of the attention's cost. This kernel reads each key and
// value row where it lies in the cache, sixteen at a time for all the query rows (queries x
// heads) that read the same KV head, while they sit in L1; the scores take eight keys as
// eight independent FMA chains (docs/cpu-engine.md#attention has the figures).
//
// Request b has seq_lens[b] keys at rows req_to_token[req_pool_indices[b], 0..seq_lens[b]);
// its last ext_lens[b] tokens are its queries (q rows ext_start[b]..), at positions
// prefix + i with prefix = seq_lens[b] - ext_lens[b]. With k_new/v_new given, the keys of
// those extend tokens are read from them (row ext_start[b] + i) instead of the cache.
// Query i sees key j when j < prefix (the cached prefix) or, inside the extend block,
// when the tree mask says so (tree_mask: bool, request b's [e, e] block after those of the
// earlier requests), else when j - prefix <= i (is_causal), else always; and, with a
// sliding window (window_plus_one > 0), only when (prefix + i) - j < window_plus_one.
// Scores are scaled, then capped (logit_cap > 0: cap * tanh(s / cap)); fp32 throughout,
// the softmax's exponentials from a vectorized polynomial (relative error about 2e-7).
//
// Summation order: a query row's scores, softmax and output are fixed-order sums over its
// visible keys in key order (vector lanes over the head dim, a fixed lane reduction, the
// tail), whatever the other rows, requests or masked keys are; so a verify row and a decode
// row over the same keys give bit-identical outputs.
//
// fp32 or bf16 q / cache / out (all one dtype); sinks, fp8 caches and differing head dims
// stay with the torch path (ops/attention.py decides). Built with small_gemm.cpp into one
// module by eagle3_backend.cpu.small_gemm.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "vec_exp.h"

namespace {

using at::BFloat16;

inline float to_f(float v) { return v; }
inline float to_f(BFloat16 v) { return static_cast<float>(v); }
inline void from_f(float v, float* p) { *p = v; }
inline void from_f(float v, BFloat16* p) { *p = BFloat16(v); }

#if E3_VEC_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float hsum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 0x55)));
}

// Lane i of the result: the eight lanes of a_i summed as ((l0 + l1) + (l2 + l3)) +
// ((l4 + l5) + (l6 + l7)), the same tree for every i. (Accumulators are passed and kept as
// named values throughout: in an array GCC stores them to the stack at every step.)
inline __m256 reduce8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                      __m256 a6, __m256 a7) {
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

#define E3_REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

// the dot products of eight keys kk[0..8) with NR = 1 or 2 query rows over D8 (a multiple of
// 8), eight lanes each, reduced by reduce8: r[x] lane i = q_x . kk[i]
template <int NR, typename T>
inline void dots8(const float* q, int64_t ldq, const T* const* kk, int64_t D8, __m256* r) {
  static_assert(NR == 1 || NR == 2, "one or two query rows");
  const __m256 z = _mm256_setzero_ps();
#define E3_DECL(i) __m256 a##i = z, b##i = z;
  E3_REP8(E3_DECL)
#undef E3_DECL
  for (int64_t d = 0; d < D8; d += 8) {
    const __m256 qa = _mm256_loadu_ps(q + d);
    const __m256 qb = NR == 2 ? _mm256_loadu_ps(q + ldq + d) : z;
#define E3_FMA(i)                                           \
  {                                                         \
    const __m256 kv = load8(kk[i] + d);                     \
    a##i = _mm256_fmadd_ps(qa, kv, a##i);                   \
    if constexpr (NR == 2) b##i = _mm256_fmadd_ps(qb, kv, b##i); \
  }
    E3_REP8(E3_FMA)
#undef E3_FMA
  }
  r[0] = reduce8(a0, a1, a2, a3, a4, a5, a6, a7);
  if constexpr (NR == 2) r[1] = reduce8(b0, b1, b2, b3, b4, b5, b6, b7);
}
#endif

// s_x[t] = q_x . k[t] over D for t < n and NR query rows x (q_x = q + x * ldq, fp32; s_x =
// s + x * lds). Each score is the same fixed-order sum whatever the other keys and rows are:
// eight lanes over D (lane l takes d = l, l + 8, ...), reduce8's tree, then the D % 8 tail
// in order. Eight keys at a time, each key loaded once for the NR rows.
template <int NR, typename T>
inline void scores(const float* q, int64_t ldq, const T* const* k, int64_t n, int64_t D, float* s,
                   int64_t lds) {
#if E3_VEC_AVX2
  const int64_t D8 = D - D % 8;
  for (int64_t t = 0; t < n; t += 8) {
    const int64_t m = std::min<int64_t>(8, n - t);
    const T* kk[8];
    for (int64_t i = 0; i < 8; ++i) kk[i] = k[t + std::min(i, m - 1)];  // a short block repeats its last key
    __m256 r[NR];
    dots8<NR>(q, ldq, kk, D8, r);
    for (int x = 0; x < NR; ++x) {
      if (m == 8 && D8 == D) {          // the whole block: the lanes are the scores
        _mm256_storeu_ps(s + x * lds + t, r[x]);
        continue;
      }
      alignas(32) float v[8];
      _mm256_store_ps(v, r[x]);
      const float* qx = q + x * ldq;
      for (int64_t i = 0; i < m; ++i) {
        float y = v[i];
        for (int64_t d = D8; d < D; ++d) y = std::fma(qx[d], to_f(kk[i][d]), y);
        s[x * lds + t + i] = y;
      }
    }
  }
#else
  for (int x = 0; x < NR; ++x)
    for (int64_t t = 0; t < n; ++t) {
      float v = 0.f;
      for (int64_t d = 0; d < D; ++d) v = std::fma(q[x * ldq + d], to_f(k[t][d]), v);
      s[x * lds + t] = v;
    }
#endif
}

// s[0..n) (padded with room for a multiple of 8) -> softmax weights, in place
inline void softmax(float* s, int64_t n) {
#if E3_VEC_AVX2
  const int64_t n8 = (n + 7) & ~int64_t(7);
  for (int64_t j = n; j < n8; ++j) s[j] = -std::numeric_limits<float>::infinity();
  __m256 mv = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n8; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
  float mx[8];
  _mm256_storeu_ps(mx, mv);
  const float m = *std::max_element(mx, mx + 8);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = e3::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mb));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  const __m256 inv = _mm256_set1_ps(1.f / hsum8(sum));
  for (int64_t j = 0; j < n8; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
#else
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  for (int64_t j = 0; j < n; ++j) s[j] /= sum;
#endif
}

// acc_x[0..Dv) += sum over t of p_x[t] * v[t][0..Dv) for NR rows x (p_x = p + x * ldp,
// acc_x = acc + x * lda): per element one FMA chain over the keys in order (fp32), continuing
// from acc, so a sum split over several calls equals one call over all the keys bit for bit,
// whatever the chunking and the other rows; each value row is loaded once for the NR rows.
template <int NR, int C, typename T>
inline void weighted_chunk(const float* p, int64_t ldp, const T* const* v, int64_t n, int64_t d,
                           float* acc, int64_t lda) {
#if E3_VEC_AVX2
  static_assert(NR == 1 || NR == 2, "one or two rows");
  static_assert(C == 1 || C == 4 || C == 8, "1, 4 or 8 lanes of eight");
  float* a0p = acc + d;
  float* b0p = acc + lda + d;
#define E3_DECL(i)                                                            \
  __m256 a##i = i < C ? _mm256_loadu_ps(a0p + 8 * (i % C)) : _mm256_setzero_ps(); \
  __m256 b##i = NR == 2 && i < C ? _mm256_loadu_ps(b0p + 8 * (i % C)) : _mm256_setzero_ps();
  E3_REP8(E3_DECL)
#undef E3_DECL
  for (int64_t t = 0; t < n; ++t) {
    const __m256 pa = _mm256_set1_ps(p[t]);
    const __m256 pb = NR == 2 ? _mm256_set1_ps(p[ldp + t]) : pa;
    const T* vt = v[t] + d;
#define E3_FMA(i)                                                   \
  if constexpr (i < C) {                                            \
    const __m256 vv = load8(vt + 8 * i);                            \
    a##i = _mm256_fmadd_ps(pa, vv, a##i);                           \
    if constexpr (NR == 2) b##i = _mm256_fmadd_ps(pb, vv, b##i);    \
  }
    E3_REP8(E3_FMA)
#undef E3_FMA
  }
#define E3_STORE(i)                                                 \
  if constexpr (i < C) {                                            \
    _mm256_storeu_ps(a0p + 8 * i, a##i);                            \
    if constexpr (NR == 2) _mm256_storeu_ps(b0p + 8 * i, b##i);     \
  }
  E3_REP8(E3_STORE)
#undef E3_STORE
#endif
}

template <int NR, typename T>
inline void weighted_add(const float* p, int64_t ldp, const T* const* v, int64_t n, int64_t Dv,
                         float* acc, int64_t lda) {
  int64_t d = 0;
#if E3_VEC_AVX2
  for (; d + 64 <= Dv; d += 64) weighted_chunk<NR, 8>(p, ldp, v, n, d, acc, lda);
  for (; d + 32 <= Dv; d += 32) weighted_chunk<NR, 4>(p, ldp, v, n, d, acc, lda);
  for (; d + 8 <= Dv; d += 8) weighted_chunk<NR, 1>(p, ldp, v, n, d, acc, lda);
#endif
  for (; d < Dv; ++d)
    for (int x = 0; x < NR; ++x)
      for (int64_t t = 0; t < n; ++t)
        acc[x * lda + d] = std::fma(p[x * ldp + t], to_f(v[t][d]), acc[x * lda + d]);
}

inline int64_t read_index(const void* base, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(base)[i] : static_cast<const int32_t*>(base)[i];
}

struct Request {
  int64_t total, ext, start, tree_off;
  const void* rows;  // req_to_token row of this request
};

template <typename T>
void run(const torch::Tensor& q, torch::Tensor& out, const torch::Tensor& k_buf,
         const torch::Tensor& v_buf, const T* k_new, const T* v_new,
         const std::vector<Request>& reqs, bool rows64, const bool* tree, bool is_causal,
         float scale, float cap, int64_t window) {
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = k_buf.size(1), Dv = v_buf.size(2);
  const int64_t G = Hq / Hkv;
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* kb = k_buf.data_ptr<T>();
  const T* vb = v_buf.data_ptr<T>();
  const int64_t q_row = q.stride(0), q_head = q.stride(1), o_row = out.stride(0), o_head = out.stride(1);
  const int64_t kb_row = k_buf.stride(0), kb_head = k_buf.stride(1);
  const int64_t vb_row = v_buf.stride(0), vb_head = v_buf.stride(1);
  const int64_t kn_row = Hkv * D, vn_row = Hkv * Dv;  // k_new / v_new are contiguous
  const int64_t B = static_cast<int64_t>(reqs.size());

  // A work item is a chunk of the rows (query, head) of one request that read one KV head.
  // Without a sliding window all of them see the request's cached prefix: its keys and values
  // are taken kBlock at a time, and each block serves every row of the chunk while it sits in
  // L1 (a row's own extend keys follow). With a window each row reads its keys on its own.
  // Either way a row's scores, softmax and sums are the same fixed-order sums over its keys.
  constexpr int64_t kBlock = 16;
  int64_t chunks = 1;
  const int64_t threads = at::get_num_threads(), heads = B * Hkv;
  if (heads < 2 * threads) chunks = (2 * threads + heads - 1) / heads;
  at::parallel_for(0, heads * chunks, 1, [&](int64_t w0, int64_t w1) {
    std::vector<const T*> kp, vp, ek, ev;
    std::vector<float> qf, s, acc;
    std::vector<int64_t> en;
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (Hkv * chunks), h = (w / chunks) % Hkv, c = w % chunks;
      const Request& r = reqs[b];
      const int64_t L = r.total, E = r.ext, prefix = L - E, R = E * G;
      const int64_t per = (R + chunks - 1) / chunks, r0 = c * per, r1 = std::min(R, r0 + per);
      if (r0 >= r1) continue;
      const int64_t nr = r1 - r0, S = L + 8;
      kp.resize(L);
      vp.resize(L);
      for (int64_t j = 0; j < L; ++j) {
        if (k_new != nullptr && j >= prefix) {
          kp[j] = k_new + (r.start + j - prefix) * kn_row + h * D;
          vp[j] = v_new + (r.start + j - prefix) * vn_row + h * Dv;
        } else {
          const int64_t row = read_index(r.rows, rows64, j);
          kp[j] = kb + row * kb_row + h * kb_head;
          vp[j] = vb + row * vb_row + h * vb_head;
        }
      }
      qf.resize(nr * D);
      s.resize(nr * S);
      acc.assign(nr * Dv, 0.f);
      ek.resize(nr * L);
      ev.resize(nr * L);
      en.resize(nr);
      const int64_t shared = window <= 0 ? prefix : 0;  // keys every row sees, from key 0
      for (int64_t x = 0; x < nr; ++x) {
        // row x: query i, head h * G + g; the keys it sees beyond the shared ones, in order
        const int64_t i = (r0 + x) / G, g = (r0 + x) % G, pos = prefix + i;
        const T* qh = qp + (r.start + i) * q_row + (h * G + g) * q_head;
        for (int64_t d = 0; d < D; ++d) qf[x * D + d] = to_f(qh[d]);
        int64_t n = 0;
        for (int64_t j = shared; j < L; ++j) {
          bool v = true;
          if (j >= prefix) {
            const int64_t jj = j - prefix;
            if (tree != nullptr) v = tree[r.tree_off + i * E + jj];
            else if (is_causal) v = jj <= i;
          }
          if (window > 0 && pos - j >= window) v = false;
          if (v) {
            ek[x * L + n] = kp[j];
            ev[x * L + n] = vp[j];
            ++n;
          }
        }
        en[x] = n;
      }
      for (int64_t t = 0; t < shared; t += kBlock) {
        const int64_t m = std::min(kBlock, shared - t);
        int64_t x = 0;
        for (; x + 2 <= nr; x += 2) scores<2>(&qf[x * D], D, &kp[t], m, D, &s[x * S + t], S);
        if (x < nr) scores<1>(&qf[x * D], D, &kp[t], m, D, &s[x * S + t], S);
      }
      for (int64_t x = 0; x < nr; ++x) {
        const int64_t n = shared + en[x];
        float* sx = &s[x * S];
        scores<1>(&qf[x * D], D, &ek[x * L], en[x], D, sx + shared, S);
        if (cap > 0.f) {
          for (int64_t t = 0; t < n; ++t) sx[t] = cap * std::tanh(sx[t] * scale / cap);
        } else {
          for (int64_t t = 0; t < n; ++t) sx[t] *= scale;
        }
        if (n > 0) softmax(sx, n);
      }
      for (int64_t t = 0; t < shared; t += kBlock) {
        const int64_t m = std::min(kBlock, shared - t);
        int64_t x = 0;
        for (; x + 2 <= nr; x += 2) weighted_add<2>(&s[x * S + t], S, &vp[t], m, Dv, &acc[x * Dv], Dv);
        if (x < nr) weighted_add<1>(&s[x * S + t], S, &vp[t], m, Dv, &acc[x * Dv], Dv);
      }
      for (int64_t x = 0; x < nr; ++x) {
        weighted_add<1>(&s[x * S + shared], S, &ev[x * L], en[x], Dv, &acc[x * Dv], Dv);
        const int64_t i = (r0 + x) / G, g = (r0 + x) % G;   // no keys at all: zeros
        T* oh = op + (r.start + i) * o_row + (h * G + g) * o_head;
        for (int64_t d = 0; d < Dv; ++d) from_f(acc[x * Dv + d], oh + d);
      }
    }
  });
}

int64_t at_i(const torch::Tensor& t, int64_t i) {
  return t.scalar_type() == at::kLong ? t.data_ptr<int64_t>()[i] : t.data_ptr<int32_t>()[i];
}

}  // namespace

void paged_attention(const torch::Tensor& q, torch::Tensor& out, const torch::Tensor& k_buf,
                     const torch::Tensor& v_buf, const c10::optional<torch::Tensor>& k_new,
                     const c10::optional<torch::Tensor>& v_new, const torch::Tensor& req_to_token,
                     const torch::Tensor& req_pool_indices, const torch::Tensor& seq_lens,
                     const torch::Tensor& ext_lens, const torch::Tensor& ext_start,
                     const c10::optional<torch::Tensor>& tree_mask, bool is_causal, double scale,
                     double logit_cap, int64_t window_plus_one) {
  const auto dt = q.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "paged_attention: float32 or bfloat16, got ", dt);
  TORCH_CHECK(k_buf.scalar_type() == dt && v_buf.scalar_type() == dt && out.scalar_type() == dt,
              "paged_attention: q, the cache and out must share one dtype");
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && k_buf.dim() == 3 && v_buf.dim() == 3,
              "paged_attention: q/out [T, H, D], caches [S, H, D]");
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1 && k_buf.stride(2) == 1 && v_buf.stride(2) == 1,
              "paged_attention: the head dim must be contiguous");
  TORCH_CHECK(q.size(2) == k_buf.size(2) && q.size(1) % k_buf.size(1) == 0 &&
                  out.size(2) == v_buf.size(2) && out.size(1) == q.size(1),
              "paged_attention: head counts or dims do not match");
  TORCH_CHECK(req_to_token.is_contiguous() &&
                  (req_to_token.scalar_type() == at::kInt || req_to_token.scalar_type() == at::kLong),
              "paged_attention: req_to_token must be contiguous int32/int64");
  const bool has_new = k_new.has_value() && k_new->defined();
  torch::Tensor kn, vn;
  if (has_new) {
    TORCH_CHECK(v_new.has_value() && v_new->defined(), "paged_attention: k_new without v_new");
    kn = k_new->contiguous();
    vn = v_new->contiguous();
    TORCH_CHECK(kn.scalar_type() == dt && vn.scalar_type() == dt &&
                    kn.size(1) == k_buf.size(1) && kn.size(2) == k_buf.size(2) &&
                    vn.size(1) == v_buf.size(1) && vn.size(2) == v_buf.size(2),
                "paged_attention: new keys/values must match the cache's heads, dims and dtype");
  }
  const bool* tree = nullptr;
  torch::Tensor tm;
  if (tree_mask.has_value() && tree_mask->defined()) {
    tm = tree_mask->contiguous();
    TORCH_CHECK(tm.scalar_type() == at::kBool, "paged_attention: tree_mask must be bool");
    tree = tm.data_ptr<bool>();
  }
  auto rpi = req_pool_indices.contiguous(), sl = seq_lens.contiguous();
  auto el = ext_lens.contiguous(), es = ext_start.contiguous();
  const int64_t B = sl.numel();
  const int64_t P = req_to_token.size(1);
  const bool rows64 = req_to_token.scalar_type() == at::kLong;
  const char* base = static_cast<const char*>(req_to_token.data_ptr());
  const int64_t isz = rows64 ? 8 : 4;
  std::vector<Request> reqs(B);
  int64_t tree_off = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t total = at_i(sl, b), e = at_i(el, b);
    TORCH_CHECK(0 <= e && e <= total && total <= P, "paged_attention: request ", b, " has ", e,
                " queries over ", total, " keys (pool rows hold ", P, ")");
    reqs[b] = {total, e, at_i(es, b), tree_off, base + at_i(rpi, b) * P * isz};
    TORCH_CHECK(reqs[b].start >= 0 && reqs[b].start + e <= q.size(0),
                "paged_attention: request ", b, "'s queries lie outside q");
    tree_off += e * e;
  }
  TORCH_CHECK(tree == nullptr || tree_off <= tm.numel(), "paged_attention: tree_mask holds ",
              tm.numel(), " entries, the requests need ", tree_off);
  const float s = static_cast<float>(scale), c = static_cast<float>(logit_cap);
  if (dt == at::kFloat)
    run<float>(q, out, k_buf, v_buf, has_new ? kn.data_ptr<float>() : nullptr,
               has_new ? vn.data_ptr<float>() : nullptr, reqs, rows64, tree, is_causal, s, c,
               window_plus_one);
  else
    run<BFloat16>(q, out, k_buf, v_buf, has_new ? kn.data_ptr<BFloat16>() : nullptr,
                  has_new ? vn.data_ptr<BFloat16>() : nullptr, reqs, rows64, tree, is_causal, s, c,
                  window_plus_one);
}

// copy_all_layer_kv_cache_cpu's work (ops/kv_copy.py): in every buffer i (base address
// ptrs[i], rows of strides[i] bytes), row tgt[j] <- row src[j]. All source rows of a buffer
// are read before any is written, so overlapping source and target sets read old values.
void copy_kv_rows(const at::Tensor& ptrs, const at::Tensor& strides, const at::Tensor& tgt,
                  const at::Tensor& src) {
  TORCH_CHECK(ptrs.dim() == 1 && ptrs.element_size() == 8 && ptrs.is_contiguous() &&
                  strides.scalar_type() == at::kLong && strides.is_contiguous() &&
                  strides.numel() == ptrs.numel(),
              "copy_kv_rows: ptrs must be [n] 64-bit addresses and strides [n] int64");
  TORCH_CHECK(tgt.scalar_type() == at::kLong && src.scalar_type() == at::kLong &&
                  tgt.is_contiguous() && src.is_contiguous() && tgt.numel() == src.numel(),
              "copy_kv_rows: tgt and src must be int64 of equal length");
  const auto* base = reinterpret_cast<const uint64_t*>(ptrs.data_ptr());
  const int64_t* stride = strides.data_ptr<int64_t>();
  const int64_t* t = tgt.data_ptr<int64_t>();
  const int64_t* s = src.data_ptr<int64_t>();
  const int64_t n = tgt.numel();
  std::vector<uint8_t> held;
  for (int64_t i = 0; i < ptrs.numel(); ++i) {
    auto* rows = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(base[i]));
    const int64_t w = stride[i];
    held.resize(size_t(n * w));
    for (int64_t j = 0; j < n; ++j) std::memcpy(held.data() + j * w, rows + s[j] * w, size_t(w));
    for (int64_t j = 0; j < n; ++j) std::memcpy(rows + t[j] * w, held.data() + j * w, size_t(w));
  }
}

void register_paged_attention(pybind11::module_& m) {
  m.def("paged_attention", &paged_attention, "extend / decode attention over SGLang's paged KV cache");
  m.def("copy_kv_rows", &copy_kv_rows,
        "rows tgt <- rows src in every buffer given by its base address and row stride in bytes");
}
