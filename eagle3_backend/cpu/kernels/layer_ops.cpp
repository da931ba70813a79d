// RMSNorm (with the residual add), SiLU-and-mul and rotary embedding for SGLang's CPU engine,
// one call each where SGLang's torch-native forwards run eight to fifteen small ops. At one
// token a step (a decode, a draft step) those ops cost their dispatch, not their arithmetic:
// SmolLM2-135M runs 61 norms, 30 rotary calls and 30 activations a step. SGLang only uses
// sgl_kernel's fused CPU versions behind a real AMX probe; eagle3_backend/cpu/layer_ops.py
// points the loaded model's layers at these instead.
//
// Semantics are those of the native forwards (sglang/srt/layers: RMSNorm.forward_native,
// SiluAndMul.forward_native, RotaryEmbedding.forward_native with apply_rotary_emb), fp32
// arithmetic:
//   rms_norm:     s = x (+ residual); y = s * rsqrt(mean(s^2) + eps) * w; returns y (and s)
//   silu_and_mul: y = silu(x[..., :d]) * x[..., d:] (eight lanes at a time from vec_exp.h's
//                 e^x, relative error about 2e-7; the tail with std::exp)
//   rotary:       per head, (x1, x2) = halves (neox) or even / odd lanes (GPT-J) of the first
//                 rotary_dim values; o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin; the rest
//                 copied; cos / sin from cos_sin_cache[position] = [cos | sin].
// Every row is computed alone, in a fixed order, so a row's result does not depend on the
// other rows in the call (a verify row equals the decode row it replaces, bit for bit).
// rms_norm takes fp32 or bf16 x / residual (its sums in fp32, as native); silu_and_mul and
// rotary take fp32 (layer_ops.py keeps the native path for anything else).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "vec_exp.h"

namespace {

using at::BFloat16;

constexpr int64_t kGrain = 16;  // rows per parallel work item: one-token calls stay serial

inline float to_f(float v) { return v; }
inline float to_f(BFloat16 v) { return static_cast<float>(v); }
template <typename T> inline T from_f(float v) { return static_cast<T>(v); }

// Row r of a [rows, n] view whose rows may be strided (a slice of a fused projection).
template <typename T> inline const T* row(const at::Tensor& t, int64_t r) {
  return t.data_ptr<T>() + r * t.stride(0);
}

at::Tensor rows2d(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) > 0, "layer_ops: ", what, " has no last dimension");
  at::Tensor v = t.reshape({-1, t.size(-1)});
  return v.stride(1) == 1 ? v : v.contiguous();
}

template <typename T, typename W>
void norm_rows(const at::Tensor& x, const at::Tensor* res, const W* w, float eps, at::Tensor& y,
               at::Tensor* sum_out) {
  const int64_t M = x.size(0), H = x.size(1);
  at::parallel_for(0, M, kGrain, [&](int64_t r0, int64_t r1) {
    std::vector<float> s(H);
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = row<T>(x, r);
      if (res != nullptr) {
        const T* rr = row<T>(*res, r);
        T* so = sum_out->data_ptr<T>() + r * H;
        for (int64_t i = 0; i < H; ++i) {
          s[i] = to_f(xr[i]) + to_f(rr[i]);
          so[i] = from_f<T>(s[i]);
        }
      } else {
        for (int64_t i = 0; i < H; ++i) s[i] = to_f(xr[i]);
      }
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // fixed lanes, then a fixed reduction
      int64_t i = 0;
      for (; i + 8 <= H; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += s[i + l] * s[i + l];
      float ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
      for (; i < H; ++i) ss += s[i] * s[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
      T* yr = y.data_ptr<T>() + r * H;
      for (int64_t j = 0; j < H; ++j) yr[j] = from_f<T>(s[j] * inv * to_f(w[j]));
    }
  });
}

// y = RMSNorm(x (+ residual)); with a residual also returns the sum (the next residual).
std::vector<at::Tensor> rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps,
                                 const c10::optional<at::Tensor>& residual) {
  const auto dt = x_in.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16, "rms_norm: x must be fp32 or bf16");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x_in.size(-1) && weight.is_contiguous(),
              "rms_norm: weight must be [", x_in.size(-1), "]");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
              "rms_norm: weight must be fp32 or bf16");
  const at::Tensor x = rows2d(x_in, "x");
  at::Tensor res;
  if (residual.has_value()) {
    TORCH_CHECK(residual->scalar_type() == dt && residual->sizes() == x_in.sizes(),
                "rms_norm: residual must match x in shape and dtype");
    res = rows2d(*residual, "residual");
  }
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor sum = residual.has_value() ? at::empty(x.sizes(), x.options()) : at::Tensor();
  const float e = static_cast<float>(eps);
  const at::Tensor* rp = residual.has_value() ? &res : nullptr;
  at::Tensor* sp = residual.has_value() ? &sum : nullptr;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    if (weight.scalar_type() == at::kFloat)
      norm_rows<T, float>(x, rp, weight.data_ptr<float>(), e, y, sp);
    else
      norm_rows<T, BFloat16>(x, rp, weight.data_ptr<BFloat16>(), e, y, sp);
  };
  if (dt == at::kFloat) go(float{}); else go(BFloat16{});
  std::vector<at::Tensor> outs{y.view(x_in.sizes())};
  if (residual.has_value()) outs.push_back(sum.view(x_in.sizes()));
  return outs;
}

at::Tensor silu_and_mul(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "silu_and_mul: x must be fp32");
  TORCH_CHECK(x_in.size(-1) % 2 == 0, "silu_and_mul: the last dimension must be even");
  const at::Tensor x = rows2d(x_in, "x");
  const int64_t M = x.size(0), d = x.size(1) / 2;
  at::Tensor y = at::empty({M, d}, x.options());
  at::parallel_for(0, M, kGrain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = row<float>(x, r);
      const float* u = g + d;
      float* yr = y.data_ptr<float>() + r * d;
      int64_t j = 0;
#if E3_VEC_AVX2
      for (; j + 8 <= d; j += 8)
        _mm256_storeu_ps(yr + j, e3::silu_mul8(_mm256_loadu_ps(g + j), _mm256_loadu_ps(u + j)));
#endif
      for (; j < d; ++j) yr[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  });
  auto shape = x_in.sizes().vec();
  shape.back() = d;
  return y.view(shape);
}

void rotate_rows(const at::Tensor& x, at::Tensor& y, const int64_t* pos, const float* cache,
                 int64_t rot, int64_t hs, bool neox) {
  const int64_t T = x.size(0), heads = x.size(1) / hs, half = rot / 2;
  at::parallel_for(0, T, kGrain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cs = cache + pos[t] * rot;
      const float* sn = cs + half;
      const float* xr = row<float>(x, t);
      float* yr = y.data_ptr<float>() + t * heads * hs;
      for (int64_t h = 0; h < heads; ++h) {
        const float* xh = xr + h * hs;
        float* yh = yr + h * hs;
        for (int64_t j = 0; j < half; ++j) {
          const int64_t a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
          const float x1 = xh[a], x2 = xh[b];
          yh[a] = x1 * cs[j] - x2 * sn[j];
          yh[b] = x2 * cs[j] + x1 * sn[j];
        }
        for (int64_t j = rot; j < hs; ++j) yh[j] = xh[j];
      }
    }
  });
}

// (query, key) with the rotary embedding of their positions; query [T, Hq * hs], key
// [T, Hk * hs] (rows may be strided), returned as new contiguous tensors of the same shapes.
std::vector<at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& query,
                               const at::Tensor& key, const at::Tensor& cos_sin_cache,
                               int64_t head_size, int64_t rotary_dim, bool neox) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
              cos_sin_cache.scalar_type() == at::kFloat, "rotary: query, key and cache must be fp32");
  TORCH_CHECK(positions.scalar_type() == at::kLong || positions.scalar_type() == at::kInt,
              "rotary: positions must be int32 or int64");
  TORCH_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_size,
              "rotary: rotary_dim ", rotary_dim, " must be even and at most the head size ", head_size);
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == rotary_dim &&
              cos_sin_cache.is_contiguous(), "rotary: cos_sin_cache must be [positions, ", rotary_dim, "]");
  const at::Tensor pos = positions.reshape({-1}).to(at::kLong).contiguous();  // int32 -> int64
  const int64_t T = pos.size(0);
  if (T == 0) return {query.clone(), key.clone()};
  auto flat = [&](const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.numel() % (T * head_size) == 0 && t.size(0) == T, "rotary: ", what,
                " must have ", T, " rows of whole heads of ", head_size);
    return rows2d(t.reshape({T, -1}), what);
  };
  const at::Tensor q = flat(query, "query"), k = flat(key, "key");
  const int64_t P = cos_sin_cache.size(0);
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(0 <= pp[t] && pp[t] < P, "rotary: position ", pp[t], " is outside the cos/sin "
                "cache (", P, " positions)");
  at::Tensor qo = at::empty(q.sizes(), q.options()), ko = at::empty(k.sizes(), k.options());
  const float* cache = cos_sin_cache.data_ptr<float>();
  rotate_rows(q, qo, pp, cache, rotary_dim, head_size, neox);
  rotate_rows(k, ko, pp, cache, rotary_dim, head_size, neox);
  return {qo.view(query.sizes()), ko.view(key.sizes())};
}

}  // namespace

void register_layer_ops(pybind11::module_& m) {
  m.def("rms_norm", &rms_norm, "RMSNorm(x (+ residual)) -> [y] or [y, x + residual]",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"),
        pybind11::arg("residual") = pybind11::none());
  m.def("silu_and_mul", &silu_and_mul, "silu(x[..., :d]) * x[..., d:]");
  m.def("rotary", &rotary, "rotary embedding of query and key at their positions");
}
