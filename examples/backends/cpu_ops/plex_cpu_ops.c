/* The vendor-independent half of PLeX's CPU backends (examples/backends/blas and mkl list this
 * file in their `sources`): the matmul op over the backend library's sgemm, the attention's
 * masked softmax, the attention op around two sgemms, and the GELU op. The attention's softmax
 * is computed on one head's score block at a time (128 x 128 floats for MiniLM: it stays in the
 * core's cache).
 *
 * A source file, not a header: a package's `include_dirs` are folders of its vendor wheel, and
 * only the files a backend lists are part of its build's key, so a shared header beside the
 * sources would not rebuild the plugin when it changed. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plex_backend.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Row-major c = alpha * a @ op(b) (beta 0), op(b) = b^T when trans_b: one single-threaded call of
 * the backend's BLAS. Each backend's C file defines it, with exactly this signature. */
void plex_cpu_sgemm(int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float* c, int ldc);

/* The matmul op: one sgemm per batch (b shared by all of them or one per batch). */
int plex_backend_matmul(const plex_matmul_args_t* args) {
  const float* a = args->a + args->a_offset;
  const float* b = args->b + args->b_offset;
  float* c = args->c + args->c_offset;
  const int m = (int)args->m, n = (int)args->n, k = (int)args->k, ld = (int)args->ld;
  const int transpose_b = (args->flags & PLEX_MATMUL_TRANSPOSE_B) != 0;
  const size_t b_stride = (args->flags & PLEX_MATMUL_SHARED_B) ? 0 : (size_t)k * ld;
  for (size_t i = 0; i < args->batch; ++i) {
    plex_cpu_sgemm(transpose_b, m, n, k, 1.0f, a + i * (size_t)m * k, k, b + i * b_stride,
                   transpose_b ? k : ld, c + i * (size_t)m * ld, ld);
  }
  return 0;
}

/* x[j] = exp(x[j] - max) / sum over the row, in place. */
static void softmax_row_scalar(float* x, size_t n) {
  float max = -FLT_MAX, sum = 0.0f;
  for (size_t j = 0; j < n; ++j) max = x[j] > max ? x[j] : max;
  for (size_t j = 0; j < n; ++j) sum += (x[j] = expf(x[j] - max));
  const float inv = 1.0f / sum;
  for (size_t j = 0; j < n; ++j) x[j] *= inv;
}

#if defined(__x86_64__)
/* exp on 8 lanes (Cephes' expf polynomial, as in avx_mathfun): max abs relative error ~2e-7 on
 * the softmax's range (x <= 0); x below -88.37 gives 0. glibc's scalar expf made the softmax
 * cost as much as the head's two sgemms. */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

__attribute__((target("avx2,fma"))) static float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

__attribute__((target("avx2,fma"))) static float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) static void softmax_row_avx2(float* x, size_t n) {
  const size_t n8 = n & ~(size_t)7;
  __m256 vmax = _mm256_set1_ps(-FLT_MAX);
  for (size_t j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + j));
  float max = hmax8(vmax);
  for (size_t j = n8; j < n; ++j) max = x[j] > max ? x[j] : max;
  const __m256 bmax = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  for (size_t j = 0; j < n8; j += 8) {
    __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), bmax));
    _mm256_storeu_ps(x + j, p);
    vsum = _mm256_add_ps(vsum, p);
  }
  float sum = hsum8(vsum);
  for (size_t j = n8; j < n; ++j) sum += (x[j] = expf(x[j] - max));
  const float inv = 1.0f / sum;
  const __m256 binv = _mm256_set1_ps(inv);
  for (size_t j = 0; j < n8; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), binv));
  for (size_t j = n8; j < n; ++j) x[j] *= inv;
}
#endif

#if defined(__x86_64__)
/* erf by Abramowitz-Stegun 7.1.26 (max abs error 1.5e-7) on 8 lanes, then the exact GELU */
__attribute__((target("avx2,fma"))) static void gelu_row_avx2(const float* x, const float* bias,
                                                              float* y, size_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
  const __m256 half = _mm256_set1_ps(0.5f), rsqrt2 = _mm256_set1_ps(0.70710678118654752f);
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(x + j);
    if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + j));
    const __m256 z = _mm256_mul_ps(v, rsqrt2);
    const __m256 az = _mm256_andnot_ps(sign, z);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), az, one));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    p = _mm256_mul_ps(p, t);
    const __m256 e = exp8(_mm256_xor_ps(_mm256_mul_ps(az, az), sign)); /* exp(-z^2) */
    __m256 erf = _mm256_fnmadd_ps(p, e, one);                          /* erf(|z|) */
    erf = _mm256_or_ps(erf, _mm256_and_ps(z, sign));                   /* odd */
    _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_mul_ps(v, half), _mm256_add_ps(one, erf)));
  }
  for (; j < n; ++j) {
    const float v = x[j] + (bias ? bias[j] : 0.0f);
    y[j] = v * 0.5f * (1.0f + erff(v * 0.70710678118654752f));
  }
}
#endif

static void gelu_row_scalar(const float* x, const float* bias, float* y, size_t n) {
  for (size_t j = 0; j < n; ++j) {
    const float v = x[j] + (bias ? bias[j] : 0.0f);
    y[j] = v * 0.5f * (1.0f + erff(v * 0.70710678118654752f));
  }
}

int plex_backend_gelu(const plex_gelu_args_t* args) {
  const float* x = args->x + args->x_offset;
  const float* bias = (args->flags & PLEX_GELU_BIAS) ? args->bias + args->bias_offset : NULL;
  float* y = args->y + args->y_offset;
  void (*row)(const float*, const float*, float*, size_t) = gelu_row_scalar;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) row = gelu_row_avx2;
#endif
  for (size_t r = 0; r < args->rows; ++r) row(x + r * args->n, bias, y + r * args->n, args->n);
  return 0;
}

typedef void (*softmax_row_fn)(float*, size_t);

static softmax_row_fn softmax_row(void) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return softmax_row_avx2;
#endif
  return softmax_row_scalar;
}

int plex_backend_attention(const plex_attention_args_t* args) {
  const size_t l = args->l, s = args->s, e = args->e, ev = args->ev, heads = args->heads;
  const int interleaved = (args->flags & PLEX_ATTENTION_HEADS_INTERLEAVED) != 0;
  const int per_batch = (args->flags & PLEX_ATTENTION_MASK_PER_BATCH) != 0;
  /* head u = b * heads + h: where its rows start, and the distance between rows */
  const size_t lq = interleaved ? heads * e : e, lv = interleaved ? heads * ev : ev;
  uint32_t bits = (uint32_t)args->scale_bits;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  float* p = malloc(l * s * sizeof(float)); /* one head's scores, then probabilities */
  if (p == NULL) return 1;
  const softmax_row_fn row_softmax = softmax_row();
  for (size_t i = 0; i < args->batch; ++i) {
    const size_t u = args->first + i, b = u / heads, h = u % heads;
    const float* q = args->q + args->q_offset + (interleaved ? b * l * lq + h * e : u * l * e);
    const float* k = args->k + args->k_offset + (interleaved ? b * s * lq + h * e : u * s * e);
    const float* v = args->v + args->v_offset + (interleaved ? b * s * lv + h * ev : u * s * ev);
    const size_t at = (per_batch ? b : u) * l * s; /* this head's mask */
    plex_cpu_sgemm(1, (int)l, (int)s, (int)e, scale, q, (int)lq, k, (int)lq, p, (int)s);
    for (size_t r = 0; r < l; ++r) {
      float* row = p + r * s;
      if (args->flags & PLEX_ATTENTION_MASK_BOOL) {
        const uint8_t* keep = (const uint8_t*)args->mask + args->mask_offset + at + r * s;
        for (size_t j = 0; j < s; ++j) row[j] = keep[j] ? row[j] : -FLT_MAX;
      } else if (args->flags & PLEX_ATTENTION_MASK_ADD) {
        const float* add = (const float*)args->mask + args->mask_offset + at + r * s;
        for (size_t j = 0; j < s; ++j) row[j] += add[j];
      }
      row_softmax(row, s);
    }
    plex_cpu_sgemm(0, (int)l, (int)ev, (int)s, 1.0f, p, (int)s, v, (int)lv,
                   args->o + args->o_offset + i * l * ev, (int)ev);
  }
  free(p);
  return 0;
}
