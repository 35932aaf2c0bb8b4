/* The MKL backend: PLeX matmuls as Intel MKL sgemm calls on the HAL binding pointers; the
 * attention and GELU ops are ../cpu_ops/plex_cpu_ops.c around this file's sgemm.
 *
 * The plugin contains MKL's sequential layer (libmkl_intel_lp64 + libmkl_sequential +
 * libmkl_core, static): every call computes on the calling IREE worker, with no OpenMP runtime,
 * no environment variable, and every CPU kernel MKL dispatches to inside the plugin.
 */
#include <mkl.h>
#include <stddef.h>

#include "plex_backend.h"

void plex_cpu_sgemm(int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda, b, ldb, 0.0f, c, ldc);
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

/* The sequential layer has one thread whatever `threads` says: the parallelism is IREE's
 * workgroups (docs/backends.md). */
void plex_backend_set_threads(int threads) { (void)threads; }
