/* The BLAS backend: PLeX matmuls as OpenBLAS sgemm calls on the HAL binding pointers. */
#include <cblas.h>

#include "plex_backend.h"

int plex_backend_matmul(const plex_matmul_args_t* args) {
  const float* a = args->a + args->a_offset;
  const float* b = args->b + args->b_offset;
  float* c = args->c + args->c_offset;
  const int m = (int)args->m, n = (int)args->n, k = (int)args->k;
  const int transpose_b = (args->flags & PLEX_MATMUL_TRANSPOSE_B) != 0;
  const size_t b_stride = (args->flags & PLEX_MATMUL_SHARED_B) ? 0 : (size_t)k * n;
  for (size_t i = 0; i < args->batch; ++i) {
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, m, n, k,
                1.0f, a + i * (size_t)m * k, k, b + i * b_stride, transpose_b ? k : n, 0.0f,
                c + i * (size_t)m * n, n);
  }
  return 0;
}

void plex_backend_set_threads(int threads) {
  if (threads > 0) scipy_openblas_set_num_threads(threads);
}
