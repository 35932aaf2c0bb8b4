/* int8 x Q8 matrix-vector product for AVX-512 VNNI: the decode step of an int8 codec weight.
 *
 * The weight is the codec's storage, read in place from the parameters: K-major in blocks of
 * B outputs, codes [N/B][K][B] i8 (myelin.codecs._cpu_kernels.INT8_BLOCKS: B = 256 where N is a multiple,
 * else 64), scale [N] f32; w[k][n] = codes[k][n] * scale[n].
 * out[n] = init[n] + sum_k x[k] * w[k][n].
 *
 * The activation is quantized to 8 bits per group of 32 once per call (cpu_matvec.h); per
 * group, vpdpbusd multiplies 4 consecutive rows' codes with 4 activation bytes in 32 bits. It
 * multiplies unsigned by signed bytes, so the codes are made unsigned (q + 128, a sign-bit
 * flip) and the group's 128 * sum(xq) is subtracted, exactly, in integers:
 *   out[n] = init[n] + scale[n] * sum_g d[g] * (sum_e xq[32g + e] * (q[32g + e][n] + 128)
 *                                                 - 128 * sum_e xq[32g + e]). */
#include "cpu_matvec.h"

#define BLOCK 64       /* outputs per vpdpbusd step: one 64-byte line per row */
#define WIDE_BLOCK 256 /* outputs per stored block where N is a multiple */
CHECK_BLOCK(BLOCK);    /* the Python table's block (Kernel.block) */
CHECK_WIDE_BLOCK(WIDE_BLOCK);

/* The outputs c0 .. c0 + width - 1 of one stored block at `codes` (width = B: its K rows of
 * width bytes, back to back). The rows are read 4 at a time, so the block is one contiguous
 * stream (prefetched PLEX_AHEAD_BYTES on where that pays): measured on Zen 5 with the weights
 * out of cache, 1.49x the rate of the same steps over [K][N] rows (docs/codecs.md, "CPU matvec
 * kernels"). */
static inline __attribute__((always_inline)) void chunk(const int8_t* codes, const float* scale,
                                                        const float* init, float* out, size_t k,
                                                        size_t c0, size_t width, const int8_t* xq,
                                                        const float* d, const int32_t* xi) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const size_t blocks = width / BLOCK;
  /* [4b + i], 128-bit lane L, element j: output c0 + 64b + 16L + 4i + j */
  __m512 acc[WIDE_BLOCK / 16];
  __m512i p[WIDE_BLOCK / 16];
  for (size_t i = 0; i < 4 * blocks; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t g = 0; g < k / GROUP; ++g) {
    for (size_t i = 0; i < 4 * blocks; ++i) p[i] = _mm512_setzero_si512();
    for (int r = 0; r < GROUP; r += 4) {
      const size_t row = g * GROUP + r;
      int32_t quad;
      __builtin_memcpy(&quad, xq + row, 4);
      const __m512i xv = _mm512_set1_epi32(quad);
      const int8_t* c = codes + row * width;
      PREFETCH_SPAN(c, 4 * width);
      for (size_t b = 0; b < blocks; ++b, c += BLOCK) {
        const __m512i r0 = _mm512_xor_si512(_mm512_loadu_si512(c), flip);
        const __m512i r1 = _mm512_xor_si512(_mm512_loadu_si512(c + width), flip);
        const __m512i r2 = _mm512_xor_si512(_mm512_loadu_si512(c + 2 * width), flip);
        const __m512i r3 = _mm512_xor_si512(_mm512_loadu_si512(c + 3 * width), flip);
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

Q8_QUANTIZER(plex_int8_matvec_avx512vnni_quantize, quantize_q8_avx512)

/* One workgroup's share: outputs [n_begin, n_begin + n_count), whole stored blocks, of the
 * activation its quantizer packed (q8_parts). Arguments are IREE's bare-pointer memrefs (base
 * pointer, element offset). The caller checked K <= MAX_K, K % 32 == 0 and N % 64 == 0 when it
 * chose this kernel. */
void plex_int8_matvec_avx512vnni(const uint8_t* q8, size_t q8_off, const int8_t* codes,
                                 size_t codes_off, const float* scale, size_t scale_off,
                                 const float* init, size_t init_off, float* out, size_t out_off,
                                 size_t k, size_t n, size_t n_begin, size_t n_count) {
  const q8_view x = q8_parts(q8 + q8_off, k);
  const size_t end = n_begin + n_count;
  const size_t width = n % WIDE_BLOCK == 0 ? WIDE_BLOCK : BLOCK;
  /* block b of `width` outputs starts at b * K * width = c0 * K codes */
  /* `chunk` inlined with the width a constant, so its block loop unrolls and the 16 sums of a
   * wide block stay in registers */
  if (width == WIDE_BLOCK)
    for (size_t c0 = n_begin; c0 < end; c0 += WIDE_BLOCK)
      chunk(codes + codes_off + c0 * k, scale + scale_off, init + init_off, out + out_off, k, c0,
            WIDE_BLOCK, x.xq, x.d, x.xi);
  else
    for (size_t c0 = n_begin; c0 < end; c0 += BLOCK)
      chunk(codes + codes_off + c0 * k, scale + scale_off, init + init_off, out + out_off, k, c0,
            BLOCK, x.xq, x.d, x.xi);
}
