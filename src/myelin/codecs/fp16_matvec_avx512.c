/* fp16 matrix-vector product for AVX-512: the decode step of an fp16 codec weight.
 *
 * The weight is the codec's storage, read in place from the parameters (K-major, as a torch
 * Linear's consumer reads it): w [K][N] f16. out[n] = init[n] + sum_k x[k] * w[k][n], in f32:
 * each row's 128 outputs converted (vcvtph2ps) and accumulated (FMA) in 8 registers, the weight
 * streamed once, the activation read as it is (no quantization: exact to the float decode up
 * to summation order).
 *
 * One block walks down all K rows: each of its loads steps by a row every iteration, a stride
 * the hardware prefetcher follows; the block's row AHEAD rows on (cpu_matvec.h) is prefetched
 * as well (measured in the decode step, docs/codecs.md "CPU matvec kernels"). */
#include "cpu_matvec.h"

#define BLOCK 128 /* outputs per inner block: 256 bytes (4 lines) per row */
CHECK_BLOCK(BLOCK); /* the Python table's block (Kernel.block) */

static void block128(const uint16_t* w, const float* x, const float* init, float* out,
                     size_t k, size_t n, size_t n0) {
  __m512 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm512_loadu_ps(init + n0 + 16 * j);
  const uint16_t* row = w + n0;
#pragma GCC unroll 2
  for (size_t kk = 0; kk < k; ++kk, row += n) {
    const char* ahead = (const char*)(row + AHEAD * n); /* past the end: prefetches don't fault */
    for (int l = 0; l < 4; ++l) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
    const __m512 xv = _mm512_set1_ps(x[kk]);
    for (int j = 0; j < 8; ++j) {
      const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 16 * j)));
      acc[j] = _mm512_fmadd_ps(v, xv, acc[j]);
    }
  }
  for (int j = 0; j < 8; ++j) _mm512_storeu_ps(out + n0 + 16 * j, acc[j]);
}

/* One workgroup's share: outputs [n_begin, n_begin + n_count), n_count a multiple of 128.
 * Arguments are IREE's bare-pointer memrefs (base pointer, element offset). */
void plex_fp16_matvec_avx512(const float* x, size_t x_off, const uint16_t* w, size_t w_off,
                             const float* init, size_t init_off, float* out, size_t out_off,
                             size_t k, size_t n, size_t n_begin, size_t n_count) {
  for (size_t n0 = n_begin; n0 < n_begin + n_count; n0 += BLOCK) {
    block128(w + w_off, x + x_off, init + init_off, out + out_off, k, n, n0);
  }
}
