/* The MKL backend: PLeX matmuls as Intel MKL sgemm calls on the HAL binding pointers; the
 * matmul, attention and GELU ops are ../cpu_ops/plex_cpu_ops.c around this file's sgemm.
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

/* The sequential layer has one thread whatever `threads` says: the parallelism is IREE's
 * workgroups (docs/backends.md). */
void plex_backend_set_threads(int threads) { (void)threads; }
