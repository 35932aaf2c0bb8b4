/* The BLAS backend: PLeX matmuls as OpenBLAS sgemm calls on the HAL binding pointers; the
 * attention and GELU ops are ../cpu_ops/plex_cpu_ops.c around this file's sgemm. */
#include <cblas.h>
#include <stddef.h>

#include "plex_backend.h"

void plex_cpu_sgemm(int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float* c, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                    alpha, a, lda, b, ldb, 0.0f, c, ldc);
}

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

void plex_backend_set_threads(int threads) {
  if (threads > 0) scipy_openblas_set_num_threads(threads);
}
