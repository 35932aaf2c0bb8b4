/* fp16 matrix-vector product for AVX-512: the decode step of an fp16 codec weight.
 *
 * The weight is the codec's storage, read in place from the parameters: K-major in blocks of
 * B outputs, w [N/B][K][B] f16 (myelin.codecs._cpu_kernels.FLOAT_BLOCKS: B = 256 where N is a multiple,
 * else 128). out[n] = init[n] + sum_k x[k] * w[k][n], in f32: each row's outputs converted
 * (vcvtph2ps) and accumulated (FMA) in registers, the weight streamed once, the activation
 * read as it is (no quantization: exact to the float decode up to summation order).
 *
 * A block of outputs walks down all K rows (B / 16 accumulators), and its K rows of B outputs
 * lie back to back: one contiguous stream of K x B x 2 bytes, which the hardware prefetchers
 * follow close to the core's sequential read rate; on CPUs where it pays each row also prefetches
 * the one PLEX_AHEAD_BYTES on (cpu_matvec.h). Stored [K][N], the same walk stepped a row (a new
 * page) every iteration and read weights from memory 1.4x slower (docs/codecs.md, "CPU matvec
 * kernels"). */
#include "cpu_matvec.h"

#define BLOCK 128      /* outputs per narrow block: the granule a workgroup's share is counted in */
#define WIDE_BLOCK 256 /* outputs per block where N is a multiple */
CHECK_BLOCK(BLOCK);    /* the Python table's block (Kernel.block) */
CHECK_WIDE_BLOCK(WIDE_BLOCK);

/* The walk of the block at w (its K rows of ACC x 16 outputs, back to back) for outputs n0.. */
#define WALK(ACC)                                                                            \
  do {                                                                                       \
    __m512 acc[ACC];                                                                         \
    for (int j = 0; j < ACC; ++j) acc[j] = _mm512_loadu_ps(init + n0 + 16 * j);             \
    const uint16_t* row = w;                                                                 \
    _Pragma("GCC unroll 2") for (size_t kk = 0; kk < k; ++kk, row += 16 * ACC) {             \
      PREFETCH_SPAN(row, 64 * (ACC / 2));                                                   \
      const __m512 xv = _mm512_set1_ps(x[kk]);                                               \
      for (int j = 0; j < ACC; ++j) {                                                        \
        const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + 16 * j))); \
        acc[j] = _mm512_fmadd_ps(v, xv, acc[j]);                                             \
      }                                                                                      \
    }                                                                                        \
    for (int j = 0; j < ACC; ++j) _mm512_storeu_ps(out + n0 + 16 * j, acc[j]);               \
  } while (0)

static void block256(const uint16_t* w, const float* x, const float* init, float* out,
                     size_t k, size_t n0) {
  WALK(16);
}

static void block128(const uint16_t* w, const float* x, const float* init, float* out,
                     size_t k, size_t n0) {
  WALK(8);
}

/* One workgroup's share: outputs [n_begin, n_begin + n_count), whole blocks. Arguments are
 * IREE's bare-pointer memrefs (base pointer, element offset). */
void plex_fp16_matvec_avx512(const float* x, size_t x_off, const uint16_t* w, size_t w_off,
                             const float* init, size_t init_off, float* out, size_t out_off,
                             size_t k, size_t n, size_t n_begin, size_t n_count) {
  const uint16_t* wb = w + w_off;
  const float *xb = x + x_off, *ib = init + init_off;
  float* ob = out + out_off;
  const size_t end = n_begin + n_count;
  /* block b of B outputs starts at b * K * B = n0 * K elements */
  if (n % WIDE_BLOCK == 0) {
    for (size_t n0 = n_begin; n0 < end; n0 += WIDE_BLOCK) block256(wb + n0 * k, xb, ib, ob, k, n0);
  } else {
    for (size_t n0 = n_begin; n0 < end; n0 += BLOCK) block128(wb + n0 * k, xb, ib, ob, k, n0);
  }
}
