// Vectorized e^x shared by the CPU kernels (paged_attention.cpp's softmax, layer_ops.cpp's
// SiLU): Cephes' range reduction and degree-6 polynomial, eight lanes at a time, relative
// error about 2e-7 against std::exp. E3_VEC_AVX2 says whether it is compiled in (AVX2 + FMA;
// the callers keep a scalar std::exp loop otherwise).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define E3_VEC_AVX2 1
#else
#define E3_VEC_AVX2 0
#endif

#if E3_VEC_AVX2
namespace e3 {

// e^x for x <= 0 (softmax numerators, sigmoid's e^-|x|); below -88.37 it gives about 1e-38,
// not 0.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                             _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// silu(g) * u, eight lanes: g * sigmoid(g) with sigmoid from e = e^-|g| (never overflows):
// 1 / (1 + e) for g >= 0, e / (1 + e) below.
inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 e = exp8(_mm256_or_ps(g, sign));                        // e^-|g|
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.f), _mm256_add_ps(_mm256_set1_ps(1.f), e));
  const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 sig = _mm256_blendv_ps(r, _mm256_mul_ps(e, r), neg);
  return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

}  // namespace e3
#endif
