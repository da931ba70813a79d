// Paged attention for SGLang's CPU engine, in one pass over the cache: the extend (prefill
// chunks, EAGLE-3 verify with its tree mask, draft extend) and the decode that SGLang's
// intel_amx attention backend asks of sgl_kernel's extend_attention_cpu and
// decode_attention_cpu, for the shapes a served step has: a few queries per request over a
// few hundred or thousand keys. The torch implementation in ops/attention.py gathers each
// request's keys and values into new tensors and runs a dozen small ops a layer; at one
// query per request that is most of the attention's cost. This kernel reads each key and
// value row where it lies in the cache, once per KV head for all the query heads that
// share it.
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
#endif

// dot(q, k) over D, q in fp32: vector lanes over D, a fixed lane reduction, then the tail.
template <typename T>
inline float dot(const float* q, const T* k, int64_t D) {
  int64_t d = 0;
  float s = 0.f;
#if E3_VEC_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d), acc);
  s = hsum8(acc);
#endif
  for (; d < D; ++d) s = std::fma(q[d], to_f(k[d]), s);
  return s;
}

// four keys at once (independent FMA chains); each result equals dot(q, k_i, D) bit for bit
template <typename T>
inline void dot4(const float* q, const T* const* k, int64_t D, float* out) {
#if E3_VEC_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    a0 = _mm256_fmadd_ps(qv, load8(k[0] + d), a0);
    a1 = _mm256_fmadd_ps(qv, load8(k[1] + d), a1);
    a2 = _mm256_fmadd_ps(qv, load8(k[2] + d), a2);
    a3 = _mm256_fmadd_ps(qv, load8(k[3] + d), a3);
  }
  float s[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
  for (int i = 0; i < 4; ++i) {
    for (int64_t t = d; t < D; ++t) s[i] = std::fma(q[t], to_f(k[i][t]), s[i]);
    out[i] = s[i];
  }
#else
  for (int i = 0; i < 4; ++i) out[i] = dot(q, k[i], D);
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

// out[0..Dv) = sum over t of p[t] * v[t][0..Dv), keys in order (fp32 accumulators)
template <typename T>
inline void weighted_sum(const float* p, const T* const* v, int64_t n, int64_t Dv, float* out) {
  int64_t d = 0;
#if E3_VEC_AVX2
  for (; d + 32 <= Dv; d += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < n; ++t) {
      const __m256 pv = _mm256_set1_ps(p[t]);
      const T* vt = v[t] + d;
      a0 = _mm256_fmadd_ps(pv, load8(vt), a0);
      a1 = _mm256_fmadd_ps(pv, load8(vt + 8), a1);
      a2 = _mm256_fmadd_ps(pv, load8(vt + 16), a2);
      a3 = _mm256_fmadd_ps(pv, load8(vt + 24), a3);
    }
    _mm256_storeu_ps(out + d, a0);
    _mm256_storeu_ps(out + d + 8, a1);
    _mm256_storeu_ps(out + d + 16, a2);
    _mm256_storeu_ps(out + d + 24, a3);
  }
  for (; d + 8 <= Dv; d += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) a = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8(v[t] + d), a);
    _mm256_storeu_ps(out + d, a);
  }
#endif
  for (; d < Dv; ++d) {
    float a = 0.f;
    for (int64_t t = 0; t < n; ++t) a = std::fma(p[t], to_f(v[t][d]), a);
    out[d] = a;
  }
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

  at::parallel_for(0, B * Hkv, 1, [&](int64_t w0, int64_t w1) {
    std::vector<const T*> kp, vp, vk, vv;
    std::vector<float> qf, s, acc;
    for (int64_t w = w0; w < w1; ++w) {
      const Request& r = reqs[w / Hkv];
      const int64_t h = w % Hkv, L = r.total, E = r.ext, prefix = L - E;
      if (E == 0) continue;
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
      qf.resize(D);
      acc.resize(Dv);
      vk.resize(L);
      vv.resize(L);
      s.resize(L + 8);
      for (int64_t i = 0; i < E; ++i) {
        // the keys query i sees, in key order
        const int64_t pos = prefix + i;
        int64_t n = 0;
        for (int64_t j = 0; j < L; ++j) {
          bool v = true;
          if (j >= prefix) {
            const int64_t jj = j - prefix;
            if (tree != nullptr) v = tree[r.tree_off + i * E + jj];
            else if (is_causal) v = jj <= i;
          }
          if (window > 0 && pos - j >= window) v = false;
          if (v) {
            vk[n] = kp[j];
            vv[n] = vp[j];
            ++n;
          }
        }
        const T* qrow = qp + (r.start + i) * q_row;
        T* orow = op + (r.start + i) * o_row;
        for (int64_t g = 0; g < G; ++g) {
          const T* qh = qrow + (h * G + g) * q_head;
          for (int64_t d = 0; d < D; ++d) qf[d] = to_f(qh[d]);
          int64_t t = 0;
          for (; t + 4 <= n; t += 4) dot4(qf.data(), vk.data() + t, D, s.data() + t);
          for (; t < n; ++t) s[t] = dot(qf.data(), vk[t], D);
          for (t = 0; t < n; ++t) {
            float x = s[t] * scale;
            if (cap > 0.f) x = cap * std::tanh(x / cap);
            s[t] = x;
          }
          if (n == 0) {
            std::fill(acc.begin(), acc.end(), 0.f);
          } else {
            softmax(s.data(), n);
            weighted_sum(s.data(), vv.data(), n, Dv, acc.data());
          }
          T* oh = orow + (h * G + g) * o_head;
          for (int64_t d = 0; d < Dv; ++d) from_f(acc[d], oh + d);
        }
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
