/* int8 x Q8 matrix-vector product for AVX-512 VNNI: the decode step of an int8 codec weight.
 *
 * The weight is the codec's storage, read in place from the parameters (K-major, as a torch
 * Linear's consumer reads it): codes [K][N] i8, scale [N] f32; w[k][n] = codes[k][n] * scale[n].
 * out[n] = init[n] + sum_k x[k] * w[k][n].
 *
 * The activation is quantized to 8 bits per group of 32 once per call (cpu_matvec.h); per
 * group, vpdpbusd multiplies 4 consecutive rows' codes with 4 activation bytes in 32 bits. It
 * multiplies unsigned by signed bytes, so the codes are made unsigned (q + 128, a sign-bit
 * flip) and the group's 128 * sum(xq) is subtracted, exactly, in integers:
 *   out[n] = init[n] + scale[n] * sum_g d[g] * (sum_e xq[32g + e] * (q[32g + e][n] + 128)
 *                                                 - 128 * sum_e xq[32g + e]). */
#include "cpu_matvec.h"

#define BLOCK 64  /* outputs per vpdpbusd step: one 64-byte line per row */
CHECK_BLOCK(BLOCK); /* the Python table's block (Kernel.block) */
#define CHUNK 512 /* outputs per pass over the rows: their sums live in L1 (32 + 32 vectors) */
/* Rows of at most this many bytes (q / o, k / v and down at TinyLlama's sizes) are left to the
 * hardware prefetchers: measured in the decode step, the software prefetch paid on the longer
 * rows only (for q4's half-as-long rows it pays on all: docs/codecs.md "CPU matvec kernels"). */
#define SHORT_ROW 4096

/* Outputs c0 .. c0 + width - 1 (width a multiple of BLOCK, at most CHUNK). The rows are read 4
 * at a time, each across the whole chunk (512 contiguous bytes), so a cold weight streams from
 * memory: measured on Zen 5 with the weights out of cache, a 2048x2048 matvec read 18.8 GB/s
 * this way against 11.2 GB/s block by block down all rows. The rows 16 on are prefetched
 * (cpu_matvec.h prefetch_rows) where rows are longer than SHORT_ROW. */
static void chunk(const int8_t* codes, const float* scale, const float* init, float* out,
                  size_t k, size_t n, size_t c0, size_t width, const int8_t* xq,
                  const float* d, const int32_t* xi) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const size_t blocks = width / BLOCK;
  /* [4b + i], 128-bit lane L, element j: output c0 + 64b + 16L + 4i + j */
  __m512 acc[CHUNK / 16];
  __m512i p[CHUNK / 16];
  for (size_t i = 0; i < 4 * blocks; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t g = 0; g < k / GROUP; ++g) {
    for (size_t i = 0; i < 4 * blocks; ++i) p[i] = _mm512_setzero_si512();
    for (int r = 0; r < GROUP; r += 4) {
      const size_t row = g * GROUP + r;
      int32_t quad;
      __builtin_memcpy(&quad, xq + row, 4);
      const __m512i xv = _mm512_set1_epi32(quad);
      const int8_t* c = codes + row * n + c0;
      if (n > SHORT_ROW) prefetch_rows(c, n, width);
      for (size_t b = 0; b < blocks; ++b, c += BLOCK) {
        const __m512i r0 = _mm512_xor_si512(_mm512_loadu_si512(c), flip);
        const __m512i r1 = _mm512_xor_si512(_mm512_loadu_si512(c + n), flip);
        const __m512i r2 = _mm512_xor_si512(_mm512_loadu_si512(c + 2 * n), flip);
        const __m512i r3 = _mm512_xor_si512(_mm512_loadu_si512(c + 3 * n), flip);
        __m512i w[4];
        interleave4(r0, r1, r2, r3, w);
        for (int i = 0; i < 4; ++i) p[4 * b + i] = _mm512_dpbusd_epi32(p[4 * b + i], w[i], xv);
      }
    }
    const __m512i offset = _mm512_set1_epi32(128 * xi[g]);
    const __m512 dg = _mm512_set1_ps(d[g]);
    for (size_t i = 0; i < 4 * blocks; ++i)
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(p[i], offset)), dg, acc[i]);
  }
  for (size_t b = 0; b < blocks; ++b) {
    /* natural order after the transpose: v[c] holds outputs c0 + 64b + 16c .. + 15 */
    __m512i v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm512_castps_si512(acc[4 * b + i]);
    transpose_lanes(v);
    for (int c = 0; c < 4; ++c) {
      const size_t at = c0 + b * BLOCK + 16 * c;
      const __m512 r = _mm512_fmadd_ps(_mm512_castsi512_ps(v[c]), _mm512_loadu_ps(scale + at),
                                       _mm512_loadu_ps(init + at));
      _mm512_storeu_ps(out + at, r);
    }
  }
}

/* One workgroup's share: outputs [n_begin, n_begin + n_count), n_count a multiple of 64.
 * Arguments are IREE's bare-pointer memrefs (base pointer, element offset). The caller checked
 * K <= MAX_K, K % 32 == 0 and N % 64 == 0 when it chose this kernel. */
void plex_int8_matvec_avx512vnni(const float* x, size_t x_off, const int8_t* codes,
                                 size_t codes_off, const float* scale, size_t scale_off,
                                 const float* init, size_t init_off, float* out, size_t out_off,
                                 size_t k, size_t n, size_t n_begin, size_t n_count) {
  int8_t xq[MAX_K] __attribute__((aligned(64)));
  float d[MAX_K / GROUP], xs[MAX_K / GROUP];
  int32_t xi[MAX_K / GROUP];
  quantize_q8_avx512(x + x_off, k, xq, d, xs, xi);
  const size_t end = n_begin + n_count;
  for (size_t c0 = n_begin; c0 < end; c0 += CHUNK) {
    const size_t width = end - c0 < CHUNK ? end - c0 : CHUNK;
    chunk(codes + codes_off, scale + scale_off, init + init_off, out + out_off, k, n, c0, width,
          xq, d, xi);
  }
}
