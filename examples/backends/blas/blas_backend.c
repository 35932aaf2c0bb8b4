/* The BLAS backend: PLeX matmuls as OpenBLAS sgemm calls on the HAL binding pointers; the
 * matmul, attention and GELU ops are ../cpu_ops/plex_cpu_ops.c around this file's sgemm. */
#include <cblas.h>
#include <stddef.h>

#include "plex_backend.h"

void plex_cpu_sgemm(int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float* c, int ldc) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k,
                    alpha, a, lda, b, ldb, 0.0f, c, ldc);
}

void plex_backend_set_threads(int threads) {
  if (threads > 0) scipy_openblas_set_num_threads(threads);
}
