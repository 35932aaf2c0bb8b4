/* fp16 matrix-vector product for AVX-512: the decode step of an fp16 codec weight.
 *
 * The weight is the codec's storage, read in place from the parameters (K-major, as a torch
 * Linear's consumer reads it): w [K][N] f16. out[n] = init[n] + sum_k x[k] * w[k][n], in f32:
 * each row's outputs converted (vcvtph2ps) and accumulated (FMA) in registers, the weight
 * streamed once, the activation read as it is (no quantization: exact to the float decode up
 * to summation order).
 *
 * A block of outputs walks down all K rows: each of its loads steps by a row every iteration,
 * a stride the hardware prefetcher follows. How wide the block is and whether it also
 * prefetches in software depends on the row's length (measured per TinyLlama shape on weights
 * read from memory, docs/codecs.md "CPU matvec kernels"):
 * - rows over 4 KiB (N > 2048): 256 outputs (16 accumulators, 8 lines a row), the block's row
 *   AHEAD rows on (cpu_matvec.h) prefetched: every row is a new page, and the wider block
 *   reads twice the bytes of each page per visit;
 * - rows of 4 KiB or less: 128 outputs (8 accumulators), no software prefetch: the hardware
 *   prefetcher alone followed the walk faster than with it. */
#include "cpu_matvec.h"

#define BLOCK 128     /* outputs per block: the granule a workgroup's share is counted in */
#define WIDE_ROW 4096 /* row bytes above which blocks are 2 x BLOCK wide and prefetch */
CHECK_BLOCK(BLOCK);   /* the Python table's block (Kernel.block) */
#if defined(PLEX_WIDE_ROW) && PLEX_WIDE_ROW != WIDE_ROW
#error "WIDE_ROW differs from the Python table's (Kernel.wide_row)"
#endif

/* One walk down the rows for ACC x 16 outputs from n0, prefetching AHEAD rows on if `ahead`. */
#define WALK(ACC, ahead)                                                                     \
  do {                                                                                       \
    __m512 acc[ACC];                                                                         \
    for (int j = 0; j < ACC; ++j) acc[j] = _mm512_loadu_ps(init + n0 + 16 * j);             \
    const uint16_t* row = w + n0;                                                            \
    _Pragma("GCC unroll 2") for (size_t kk = 0; kk < k; ++kk, row += n) {                    \
      if (ahead) {                                                                           \
        const char* p = (const char*)(row + AHEAD * n); /* past the end: no fault */         \
        for (int l = 0; l < ACC / 2; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);            \
      }                                                                                      \
      const __m512 xv = _mm512_set1_ps(x[kk]);                                               \
      for (int j = 0; j < ACC; ++j) {                                                        \
        const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 16 * j))); \
        acc[j] = _mm512_fmadd_ps(v, xv, acc[j]);                                             \
      }                                                                                      \
    }                                                                                        \
    for (int j = 0; j < ACC; ++j) _mm512_storeu_ps(out + n0 + 16 * j, acc[j]);               \
  } while (0)

static void block256(const uint16_t* w, const float* x, const float* init, float* out,
                     size_t k, size_t n, size_t n0) {
  WALK(16, 1);
}

static void block128(const uint16_t* w, const float* x, const float* init, float* out,
                     size_t k, size_t n, size_t n0) {
  WALK(8, 0);
}

static void block128_ahead(const uint16_t* w, const float* x, const float* init, float* out,
                           size_t k, size_t n, size_t n0) {
  WALK(8, 1);
}

/* One workgroup's share: outputs [n_begin, n_begin + n_count), n_count a multiple of 128.
 * Arguments are IREE's bare-pointer memrefs (base pointer, element offset). */
void plex_fp16_matvec_avx512(const float* x, size_t x_off, const uint16_t* w, size_t w_off,
                             const float* init, size_t init_off, float* out, size_t out_off,
                             size_t k, size_t n, size_t n_begin, size_t n_count) {
  const uint16_t* wb = w + w_off;
  const float *xb = x + x_off, *ib = init + init_off;
  float* ob = out + out_off;
  size_t n0 = n_begin;
  const size_t end = n_begin + n_count;
  if (n * sizeof(uint16_t) > WIDE_ROW) {
    for (; n0 + 2 * BLOCK <= end; n0 += 2 * BLOCK) block256(wb, xb, ib, ob, k, n, n0);
    for (; n0 < end; n0 += BLOCK) block128_ahead(wb, xb, ib, ob, k, n, n0);
  } else {
    for (; n0 < end; n0 += BLOCK) block128(wb, xb, ib, ob, k, n, n0);
  }
}
