/* Shared by the CPU matvec kernels (myelin.codecs._cpu_kernels): the activation row quantized
 * to 8 bits per group of 32, as llama.cpp's Q8_0 does, once per call.
 *
 * The kernels are linked into IREE's llvm-cpu executables as static objects
 * (hal.executable.objects), so they meet the embedded-ELF rules: no libc, no globals, no TLS,
 * position independent. */
#ifndef PLEX_CPU_MATVEC_H
#define PLEX_CPU_MATVEC_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define GROUP 32
#define MAX_K 8192 /* the largest K a quantizing kernel takes (the K measured; larger untested) */

/* myelin.codecs._cpu_kernels passes its own numbers (-DPLEX_*): the two sides must agree. */
#if defined(PLEX_GROUP) && (PLEX_GROUP != GROUP || PLEX_MAX_K != MAX_K)
#error "GROUP / MAX_K differ from myelin.codecs._cpu_kernels"
#endif
#define CHECK_BLOCK(block) _Static_assert(!PLEX_BLOCK || PLEX_BLOCK == (block), "BLOCK differs")
#ifndef PLEX_BLOCK
#define PLEX_BLOCK 0
#endif
/* The software prefetch's distance down a kernel's weight stream, in bytes; 0: none, the
 * hardware prefetchers alone. The Python side picks it per target CPU (PREFETCH_AHEAD_BYTES):
 * on Zen 5 it paid, on Zen 4 it slowed a decode step's reads. A prefetch past the end of the
 * weight does not fault. */
#ifndef PLEX_AHEAD_BYTES
#define PLEX_AHEAD_BYTES 0
#endif
#define PREFETCH_AHEAD(p)                                                   \
  do {                                                                      \
    if (PLEX_AHEAD_BYTES)                                                   \
      _mm_prefetch((const char*)(p) + PLEX_AHEAD_BYTES, _MM_HINT_T0);       \
  } while (0)
/* PREFETCH_AHEAD for each 64-byte line of `bytes` from `p`. The loop sits inside the test of
 * the distance: C may not delete a loop it cannot prove finite, and gcc kept an empty loop
 * over a size_t counter in the int8 kernel's hot loop when the distance was 0 (16 idle
 * iterations per 4 rows). */
#define PREFETCH_SPAN(p, bytes)                                             \
  do {                                                                      \
    if (PLEX_AHEAD_BYTES)                                                   \
      for (size_t line_ = 0; line_ < (bytes); line_ += 64)                  \
        PREFETCH_AHEAD((const char*)(p) + line_);                           \
  } while (0)

/* The outputs of the weight's stored blocks where N is a multiple (Kernel.wide_block). */
#define CHECK_WIDE_BLOCK(block) \
  _Static_assert(!PLEX_WIDE_BLOCK || PLEX_WIDE_BLOCK == (block), "WIDE_BLOCK differs")
#ifndef PLEX_WIDE_BLOCK
#define PLEX_WIDE_BLOCK 0
#endif

/* xq[e] = round(x[e] / d[g]) (half away from zero), d[g] = max|x| / 127 over group g; xs[g] the
 * exact float sum of x over the group, xi[g] the sum of xq over it. The scalar form: every
 * kernel rounds the same way, and the numpy reference in the tests does too. */
static inline void quantize_q8(const float* x, size_t k, int8_t* xq, float* d, float* xs,
                               int32_t* xi) {
  for (size_t g = 0; g < k / GROUP; ++g) {
    const float* v = x + g * GROUP;
    float amax = 0.0f, sum = 0.0f;
    for (int e = 0; e < GROUP; ++e) {
      const float a = v[e] < 0 ? -v[e] : v[e];
      amax = a > amax ? a : amax;
      sum += v[e];
    }
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    int32_t isum = 0;
    d[g] = amax / 127.0f;
    xs[g] = sum;
    for (int e = 0; e < GROUP; ++e) {
      const float t = v[e] * inv;
      const int q = (int)(t < 0 ? t - 0.5f : t + 0.5f);
      xq[g * GROUP + e] = (int8_t)q;
      isum += q;
    }
    xi[g] = isum;
  }
}

#ifdef __AVX512F__
/* The same quantization on 512-bit registers (bit-identical to quantize_q8: the same float
 * operations per element; the sums are reassociated, xs only to rounding). */
static inline void quantize_q8_avx512(const float* x, size_t k, int8_t* xq, float* d,
                                      float* xs, int32_t* xi) {
  /* the float bit operations in integers: AVX-512F has no and/or on floats (that is DQ) */
  const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
  const __m512i half = _mm512_castps_si512(_mm512_set1_ps(0.5f));
  for (size_t g = 0; g < k / GROUP; ++g) {
    const __m512 v0 = _mm512_loadu_ps(x + g * GROUP);
    const __m512 v1 = _mm512_loadu_ps(x + g * GROUP + 16);
    const __m512 a = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
    const float amax = _mm512_reduce_max_ps(a);
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    d[g] = amax / 127.0f;
    xs[g] = _mm512_reduce_add_ps(_mm512_add_ps(v0, v1));
    const __m512 s = _mm512_set1_ps(inv);
    const __m512 t0 = _mm512_mul_ps(v0, s), t1 = _mm512_mul_ps(v1, s);
    /* t + copysign(0.5, t), truncated: half away from zero */
    const __m512 h0 = _mm512_castsi512_ps(
        _mm512_or_si512(half, _mm512_and_si512(sign, _mm512_castps_si512(t0))));
    const __m512 h1 = _mm512_castsi512_ps(
        _mm512_or_si512(half, _mm512_and_si512(sign, _mm512_castps_si512(t1))));
    const __m512i q0 = _mm512_cvttps_epi32(_mm512_add_ps(t0, h0));
    const __m512i q1 = _mm512_cvttps_epi32(_mm512_add_ps(t1, h1));
    _mm_storeu_si128((__m128i*)(xq + g * GROUP), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i*)(xq + g * GROUP + 16), _mm512_cvtepi32_epi8(q1));
    xi[g] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  }
}

#endif

/* The quantized activation as one buffer, written once per matvec call by the kernel's quantizer
 * (Q8_QUANTIZER, its own one-workgroup dispatch) and read by every workgroup of the matvec, and
 * of the other matvecs of the same activation (a layer's Q, K and V): xq[K] int8, then d, xs
 * (f32) and xi (i32), K / GROUP each. Quantized in each workgroup instead (up to 64 a matvec),
 * it took 6.8% of a one-thread decode step of TinyLlama-1.1B q4 on Zen 5. */
#define Q8_BYTES(k) ((k) + 12 * ((k) / GROUP))

typedef struct {
  const int8_t* xq;
  const float* d;
  const float* xs;
  const int32_t* xi;
} q8_view;

static inline q8_view q8_parts(const uint8_t* packed, size_t k) {
  q8_view v;
  v.xq = (const int8_t*)packed;
  v.d = (const float*)(packed + k);
  v.xs = v.d + k / GROUP;
  v.xi = (const int32_t*)(v.xs + k / GROUP);
  return v;
}

/* `void name(const float* x, size_t x_off, uint8_t* q8, size_t q8_off, size_t k)`: the
 * quantizer entry of a kernel's object, over `quantize` (quantize_q8 or its AVX-512 form). */
#define Q8_QUANTIZER(name, quantize)                                                       \
  void name(const float* x, size_t x_off, uint8_t* q8, size_t q8_off, size_t k) {          \
    const q8_view v = q8_parts(q8 + q8_off, k); /* the layout the kernels read, written */ \
    quantize(x + x_off, k, (int8_t*)v.xq, (float*)v.d, (float*)v.xs, (int32_t*)v.xi);      \
  }

#ifdef __AVX512F__
/* out lane m of vector c = in lane c of vector m, for 4 vectors of 4 128-bit lanes. */
static inline void transpose_lanes(__m512i v[4]) {
  const __m512i t0 = _mm512_shuffle_i32x4(v[0], v[1], 0x44);
  const __m512i t1 = _mm512_shuffle_i32x4(v[0], v[1], 0xEE);
  const __m512i t2 = _mm512_shuffle_i32x4(v[2], v[3], 0x44);
  const __m512i t3 = _mm512_shuffle_i32x4(v[2], v[3], 0xEE);
  v[0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
  v[1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
  v[2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
  v[3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
}

/* The 32-bit lanes of 4 rows of 64 bytes, interleaved: lane j of 128-bit lane L of out[i] holds
 * byte 16L + 4i + j of rows r0, r1, r2, r3 (in that order), the operand vpdpbusd multiplies
 * with 4 consecutive activation bytes. */
static inline void interleave4(__m512i r0, __m512i r1, __m512i r2, __m512i r3, __m512i out[4]) {
  const __m512i a = _mm512_unpacklo_epi8(r0, r1), b = _mm512_unpackhi_epi8(r0, r1);
  const __m512i c = _mm512_unpacklo_epi8(r2, r3), e = _mm512_unpackhi_epi8(r2, r3);
  out[0] = _mm512_unpacklo_epi16(a, c);
  out[1] = _mm512_unpackhi_epi16(a, c);
  out[2] = _mm512_unpacklo_epi16(b, e);
  out[3] = _mm512_unpackhi_epi16(b, e);
}
#endif

#endif
