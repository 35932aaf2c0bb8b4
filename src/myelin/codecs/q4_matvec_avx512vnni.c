/* q4 x Q8 matrix-vector product for AVX-512 VNNI: the decode step of a q4 codec weight.
 *
 * The weight is the codec's storage, read in place from the parameters: K-major in blocks of B
 * outputs (myelin.codecs._cpu_kernels.Q4_BLOCKS: B = 256 where N is a multiple, else 128 here)
 *   codes  [N/B][K][B/2] bytes: w[k][n] in the low nibble of byte (n % B) / 2 of row k of block
 *          n / B for even n, the high for odd n
 *   scale  [N/B][K/32][B] u8, offset [N/B][K/32][B] i8, row_scale [N] f32, row_offset [N] f32
 *   w[k][n] = codes * scale[g][n] * row_scale[n] + offset[g][n] * row_offset[n], g = k / 32
 * out[n] = init[n] + sum_k x[k] * w[k][n].
 *
 * As llama.cpp's Q4_0 x Q8_0: the activation is quantized once per call and group of 32
 * (cpu_matvec.h), the codes (unsigned, 0..15) are multiplied with it by vpdpbusd, 4 rows at a
 * time in 32 bits, and the group's factors are applied once per group and output in f32:
 *   out[n] = init[n] + row_scale[n] * sum_g d[g] * scale[g][n] * P[g][n]
 *                    + row_offset[n] * sum_g xs[g] * offset[g][n],
 * with P[g][n] = sum_e xq[32g + e] * codes[32g + e][n] and xs[g] the exact float sum of x over
 * the group. */
#include "cpu_matvec.h"

#define BLOCK 128      /* outputs per vpdpbusd step: one 64-byte line of codes per row */
#define WIDE_BLOCK 256 /* outputs per stored block where N is a multiple */
CHECK_BLOCK(BLOCK);    /* the Python table's block (Kernel.block) */
CHECK_WIDE_BLOCK(WIDE_BLOCK);

/* The outputs c0 .. c0 + width - 1 of one stored block (width = B): its codes at `codes` (K rows
 * of width / 2 bytes, back to back), its group factors at `scale` and `offset` (K / 32 rows of
 * width). The block is one contiguous stream (prefetched PLEX_AHEAD_BYTES on where that pays):
 * the weight streams from memory at the core's sequential rate (docs/codecs.md, "CPU matvec
 * kernels": 1.48x the rate of the same steps over [K][N] rows in the harness). Per group, one
 * 128-output half of the rows at a time, so its 8 sums stay in registers (over both halves at
 * once, 16 sums and the temporaries spilled to the stack: a load and a store per vpdpbusd). */
static void chunk(const uint8_t* codes, const uint8_t* scale, const int8_t* offset,
                  const float* row_scale, const float* row_offset, const float* init,
                  float* out, size_t k, size_t c0, size_t width, const int8_t* xq,
                  const float* d, const float* xs) {
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const size_t blocks = width / BLOCK;
  const size_t stride = width / 2;
  __m512 acc[WIDE_BLOCK / 16]; /* [8b + c]: outputs c0 + 128b + 16c .. + 15 */
  for (size_t j = 0; j < 8 * blocks; ++j) acc[j] = _mm512_setzero_ps();
  for (size_t g = 0; g < k / GROUP; ++g) {
    const uint8_t* rows = codes + g * GROUP * stride;
    PREFETCH_SPAN(rows, GROUP * stride);
    const __m512 dg = _mm512_set1_ps(d[g]);
    for (size_t b = 0; b < blocks; ++b) {
      /* q[4h + i], 128-bit lane L, element j: output c0 + 128b + 2 * (16L + 4i + j) + h */
      __m512i q[8];
      for (int i = 0; i < 8; ++i) q[i] = _mm512_setzero_si512();
      for (int r = 0; r < GROUP; r += 4) {
        int32_t quad;
        __builtin_memcpy(&quad, xq + g * GROUP + r, 4);
        const __m512i xv = _mm512_set1_epi32(quad);
        const uint8_t* c = rows + r * stride + b * (BLOCK / 2);
        const __m512i r0 = _mm512_loadu_si512(c), r1 = _mm512_loadu_si512(c + stride);
        const __m512i r2 = _mm512_loadu_si512(c + 2 * stride);
        const __m512i r3 = _mm512_loadu_si512(c + 3 * stride);
        /* pairs of rows first (one byte holds two outputs), then the nibbles, then the quads */
        const __m512i a = _mm512_unpacklo_epi8(r0, r1), bb = _mm512_unpackhi_epi8(r0, r1);
        const __m512i e = _mm512_unpacklo_epi8(r2, r3), f = _mm512_unpackhi_epi8(r2, r3);
        const __m512i al = _mm512_and_si512(a, nibble), bl = _mm512_and_si512(bb, nibble);
        const __m512i el = _mm512_and_si512(e, nibble), fl = _mm512_and_si512(f, nibble);
        const __m512i ah = _mm512_and_si512(_mm512_srli_epi16(a, 4), nibble);
        const __m512i bh = _mm512_and_si512(_mm512_srli_epi16(bb, 4), nibble);
        const __m512i eh = _mm512_and_si512(_mm512_srli_epi16(e, 4), nibble);
        const __m512i fh = _mm512_and_si512(_mm512_srli_epi16(f, 4), nibble);
        q[0] = _mm512_dpbusd_epi32(q[0], _mm512_unpacklo_epi16(al, el), xv);
        q[1] = _mm512_dpbusd_epi32(q[1], _mm512_unpackhi_epi16(al, el), xv);
        q[2] = _mm512_dpbusd_epi32(q[2], _mm512_unpacklo_epi16(bl, fl), xv);
        q[3] = _mm512_dpbusd_epi32(q[3], _mm512_unpackhi_epi16(bl, fl), xv);
        q[4] = _mm512_dpbusd_epi32(q[4], _mm512_unpacklo_epi16(ah, eh), xv);
        q[5] = _mm512_dpbusd_epi32(q[5], _mm512_unpackhi_epi16(ah, eh), xv);
        q[6] = _mm512_dpbusd_epi32(q[6], _mm512_unpacklo_epi16(bh, fh), xv);
        q[7] = _mm512_dpbusd_epi32(q[7], _mm512_unpackhi_epi16(bh, fh), xv);
      }
      /* Natural order: even and odd outputs interleaved (v[2i], v[2i + 1]: 128-bit lane L holds
       * outputs 32L + 8i + (0..7)), then the lanes transposed. */
      __m512i v[8];
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = _mm512_unpacklo_epi32(q[i], q[4 + i]);
        v[2 * i + 1] = _mm512_unpackhi_epi32(q[i], q[4 + i]);
      }
      transpose_lanes(v);     /* v[0..3] -> outputs 0-15, 32-47, 64-79, 96-111 */
      transpose_lanes(v + 4); /* v[4..7] -> outputs 16-31, 48-63, 80-95, 112-127 */
      const uint8_t* sg = scale + g * width + b * BLOCK;
      for (int a = 0; a < 4; ++a) {
        for (int s = 0; s < 2; ++s) {
          const int c = 2 * a + s;
          const __m128i s8 = _mm_loadu_si128((const __m128i*)(sg + 16 * c));
          const __m512 sf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(s8)), dg);
          acc[8 * b + c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[4 * s + a]), sf, acc[8 * b + c]);
        }
      }
    }
  }
  /* the offsets' term: one pass over the group offsets (1/16 of the codes' bytes) */
  __m512 acc_o[WIDE_BLOCK / 16];
  for (size_t j = 0; j < 8 * blocks; ++j) acc_o[j] = _mm512_setzero_ps();
  for (size_t g = 0; g < k / GROUP; ++g) {
    const __m512 xg = _mm512_set1_ps(xs[g]);
    const int8_t* og = offset + g * width;
    for (size_t j = 0; j < 8 * blocks; ++j) {
      const __m128i o8 = _mm_loadu_si128((const __m128i*)(og + 16 * j));
      acc_o[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(o8)), xg, acc_o[j]);
    }
  }
  for (size_t j = 0; j < 8 * blocks; ++j) {
    const size_t at = c0 + 16 * j;
    __m512 r = _mm512_loadu_ps(init + at);
    r = _mm512_fmadd_ps(acc[j], _mm512_loadu_ps(row_scale + at), r);
    r = _mm512_fmadd_ps(acc_o[j], _mm512_loadu_ps(row_offset + at), r);
    _mm512_storeu_ps(out + at, r);
  }
}

Q8_QUANTIZER(plex_q4_matvec_avx512vnni_quantize, quantize_q8_avx512)

/* One workgroup's share: outputs [n_begin, n_begin + n_count), whole stored blocks, of the
 * activation its quantizer packed (q8_parts). Arguments are IREE's bare-pointer memrefs (base
 * pointer, element offset). The caller checked K <= MAX_K, K % 32 == 0 and N % 128 == 0 when
 * it chose this kernel. */
void plex_q4_matvec_avx512vnni(const uint8_t* q8, size_t q8_off, const uint8_t* codes,
                               size_t codes_off, const uint8_t* scale, size_t scale_off,
                               const int8_t* offset, size_t offset_off, const float* row_scale,
                               size_t row_scale_off, const float* row_offset,
                               size_t row_offset_off, const float* init, size_t init_off,
                               float* out, size_t out_off, size_t k, size_t n, size_t n_begin,
                               size_t n_count) {
  const q8_view x = q8_parts(q8 + q8_off, k);
  const size_t end = n_begin + n_count;
  const size_t width = n % WIDE_BLOCK == 0 ? WIDE_BLOCK : BLOCK;
  /* block b of `width` outputs: its codes start at b * K * width / 2 = c0 * K / 2 bytes, its
   * group factors at b * (K / 32) * width = c0 * K / 32 */
  for (size_t c0 = n_begin; c0 < end; c0 += width)
    chunk(codes + codes_off + c0 * k / 2, scale + scale_off + c0 * (k / GROUP),
          offset + offset_off + c0 * (k / GROUP), row_scale + row_scale_off,
          row_offset + row_offset_off, init + init_off, out + out_off, k, c0, width, x.xq, x.d,
          x.xs);
}
