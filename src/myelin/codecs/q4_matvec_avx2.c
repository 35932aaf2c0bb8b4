/* q4 x Q8 matrix-vector product for AVX2 + FMA: the decode step of a q4 codec weight.
 * Built and linked into IREE's executables by myelin.codecs._cpu_kernels (docs/codecs.md,
 * "CPU matvec kernels").
 *
 * The weight is the codec's storage, read in place from the parameters: K-major in blocks of B
 * outputs (myelin.codecs._cpu_kernels.Q4_BLOCKS: B = 256, 128 or 64, the first dividing N)
 *   codes  [N/B][K][B/2] bytes: w[k][n] in the low nibble of byte (n % B) / 2 of row k of block
 *          n / B for even n, the high for odd n
 *   scale  [N/B][K/32][B] u8, offset [N/B][K/32][B] i8, row_scale [N] f32, row_offset [N] f32
 *   w[k][n] = codes * scale[g][n] * row_scale[n] + offset[g][n] * row_offset[n], g = k / 32
 * out[n] = init[n] + sum_k x[k] * w[k][n].
 *
 * As llama.cpp's Q4_0 x Q8_0: the activation is quantized once per call and group of 32
 * (cpu_matvec.h), the codes are multiplied with it in integers
 * (vpmaddubsw on pairs of rows, summed in 16 bits over 16 rows, then vpmaddwd into 32 bits),
 * and the group's factors are applied once per group and output in f32:
 *   out[n] = init[n] + row_scale[n] * sum_g d[g] * scale[g][n] * P[g][n]
 *                    + row_offset[n] * sum_g xs[g] * offset[g][n],
 * with P[g][n] = sum_e xq[32g + e] * codes[32g + e][n] and xs[g] the exact float sum of x over
 * the group. |P| per 16 rows <= 16 * 15 * 127 = 30480 fits in 16 bits. */
#include "cpu_matvec.h"

#define BLOCK 64       /* outputs per inner block: 32 bytes of codes per row */
#define WIDE_BLOCK 256 /* outputs per stored block where N is a multiple (else 128, else 64) */
CHECK_BLOCK(BLOCK);    /* the Python table's block (Kernel.block) */
CHECK_WIDE_BLOCK(WIDE_BLOCK);

/* Outputs n0 .. n0 + 63 over every group: the 64 at `local` of the stored block of `width`
 * outputs whose codes start at `codes` and group factors at `scale`, `offset`. */
static void block64(const uint8_t* codes, const uint8_t* scale, const int8_t* offset,
                    const float* row_scale, const float* row_offset, const float* init,
                    float* out, size_t k, size_t width, size_t local, size_t n0,
                    const int8_t* xq, const float* d, const float* xs) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc_s[8], acc_o[8];
  for (int j = 0; j < 8; ++j) acc_s[j] = acc_o[j] = _mm256_setzero_ps();
  const size_t stride = width / 2;
  for (size_t g = 0; g < k / GROUP; ++g) {
    /* half[h][m]: 16-bit sums over rows 16h .. 16h + 15 of the group; m selects low/high
     * nibbles (even/odd outputs) and the unpack's low/high bytes (see the order below). */
    __m256i half[2][4];
    for (int h = 0; h < 2; ++h) {
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 2
      for (int p = 0; p < 8; ++p) {
        const size_t row = g * GROUP + h * 16 + 2 * p;
        const uint8_t* r0 = codes + row * stride + local / 2;
        const __m256i v0 = _mm256_loadu_si256((const __m256i*)r0);
        const __m256i v1 = _mm256_loadu_si256((const __m256i*)(r0 + stride));
        const __m256i l0 = _mm256_and_si256(v0, nibble);
        const __m256i l1 = _mm256_and_si256(v1, nibble);
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), nibble);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), nibble);
        /* byte 0 of each 16-bit lane multiplies row `row`, byte 1 row `row + 1` */
        const __m256i xp = _mm256_broadcastw_epi16(_mm_loadu_si16(xq + row));
        a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(l0, l1), xp));
        a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(l0, l1), xp));
        a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(h0, h1), xp));
        a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(h0, h1), xp));
      }
      half[h][0] = a0, half[h][1] = a1, half[h][2] = a2, half[h][3] = a3;
    }
    /* 32-bit sums of the two halves. Lane orders (outputs, step 2 within a list):
     * m0: [0..14 | 32..46], m1: [16..30 | 48..62], m2/m3: the same + 1 (odd outputs).
     * unpacklo/hi_epi16 + madd: lo(m0) [0,2,4,6 | 32..38], hi(m0) [8..14 | 40..46]. */
    __m256i w[4][2];
    for (int m = 0; m < 4; ++m) {
      w[m][0] = _mm256_madd_epi16(_mm256_unpacklo_epi16(half[0][m], half[1][m]), ones);
      w[m][1] = _mm256_madd_epi16(_mm256_unpackhi_epi16(half[0][m], half[1][m]), ones);
    }
    /* Interleave even and odd outputs, then the 128-bit lanes: natural order, 8 per vector. */
    __m256i p[8];
    for (int m = 0; m < 2; ++m) {
      for (int q = 0; q < 2; ++q) {
        const __m256i lo = _mm256_unpacklo_epi32(w[m][q], w[m + 2][q]);
        const __m256i hi = _mm256_unpackhi_epi32(w[m][q], w[m + 2][q]);
        const int base = 2 * m + q; /* outputs 8 * base + (0..7), and 32 + the same */
        p[base] = _mm256_permute2x128_si256(lo, hi, 0x20);
        p[base + 4] = _mm256_permute2x128_si256(lo, hi, 0x31);
      }
    }
    const __m256 dg = _mm256_set1_ps(d[g]);
    const __m256 xg = _mm256_set1_ps(xs[g]);
    const uint8_t* sg = scale + g * width + local;
    const int8_t* og = offset + g * width + local;
    for (int j = 0; j < 8; ++j) {
      const int first = 8 * j; /* p[j]: outputs n0 + 8j .. n0 + 8j + 7 */
      const __m128i s8 = _mm_loadl_epi64((const __m128i*)(sg + first));
      const __m128i o8 = _mm_loadl_epi64((const __m128i*)(og + first));
      const __m256 sf = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s8)), dg);
      const __m256 of = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(o8));
      acc_s[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[j]), sf, acc_s[j]);
      acc_o[j] = _mm256_fmadd_ps(xg, of, acc_o[j]);
    }
  }
  for (int j = 0; j < 8; ++j) {
    const size_t at = n0 + 8 * j;
    __m256 r = _mm256_loadu_ps(init + at);
    r = _mm256_fmadd_ps(acc_s[j], _mm256_loadu_ps(row_scale + at), r);
    r = _mm256_fmadd_ps(acc_o[j], _mm256_loadu_ps(row_offset + at), r);
    _mm256_storeu_ps(out + at, r);
  }
}

Q8_QUANTIZER(plex_q4_matvec_avx2_quantize, quantize_q8)

/* One workgroup's share: outputs [n_begin, n_begin + n_count), whole stored blocks, of the
 * activation its quantizer packed (q8_parts). Arguments are IREE's bare-pointer memrefs (base
 * pointer, element offset). Returns nothing: the caller checked K <= MAX_K, K % 32 == 0 and
 * N % 64 == 0 when it chose this kernel. */
void plex_q4_matvec_avx2(const uint8_t* q8, size_t q8_off, const uint8_t* codes, size_t codes_off,
                         const uint8_t* scale, size_t scale_off, const int8_t* offset,
                         size_t offset_off, const float* row_scale, size_t row_scale_off,
                         const float* row_offset, size_t row_offset_off, const float* init,
                         size_t init_off, float* out, size_t out_off, size_t k, size_t n,
                         size_t n_begin, size_t n_count) {
  const q8_view x = q8_parts(q8 + q8_off, k);
  const size_t width = n % WIDE_BLOCK == 0 ? WIDE_BLOCK : n % 128 == 0 ? 128 : BLOCK;
  for (size_t c0 = n_begin; c0 < n_begin + n_count; c0 += width) {
    /* the stored block at c0: codes from c0 * K / 2 bytes, group factors from c0 * K / 32 */
    const uint8_t* c = codes + codes_off + c0 * k / 2;
    const uint8_t* s = scale + scale_off + c0 * (k / GROUP);
    const int8_t* o = offset + offset_off + c0 * (k / GROUP);
    for (size_t local = 0; local < width; local += BLOCK)
      block64(c, s, o, row_scale + row_scale_off, row_offset + row_offset_off, init + init_off,
              out + out_off, k, width, local, c0 + local, x.xq, x.d, x.xs);
  }
}
