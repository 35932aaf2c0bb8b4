/* PLeX external backend ABI, version 1.
 *
 * A backend implements the ops it declares in its package ([backend.<name>] ops) as plain C
 * functions with these signatures. PLeX compiles them together with plex_plugin.c into an IREE
 * executable plugin; the dispatches PLeX emits for placed ops call them on the buffers of the
 * HAL bindings: the pointers are the device's own memory, nothing is staged or copied.
 *
 * Rules (docs/backends.md): return 0 on success, non-zero fails the dispatch; never keep a
 * pointer after returning; write only the output; be callable from any thread, several calls at
 * a time: PLeX splits each op into workgroups (whole batches, else blocks of rows) that IREE's
 * workers run in parallel, each calling the backend on its slice. Compute on the calling thread
 * (plex_backend_set_threads(1) is the default): the parallelism is IREE's.
 */
#ifndef PLEX_BACKEND_H_
#define PLEX_BACKEND_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PLEX_BACKEND_ABI_VERSION 1

#define PLEX_BACKEND_EXPORT __attribute__((visibility("default")))

/* matmul flags */
#define PLEX_MATMUL_TRANSPOSE_B 1u /* b holds [batch][n][k] (else [batch][k][n]) */
#define PLEX_MATMUL_SHARED_B 2u    /* one b for every batch (b has no batch dimension) */

/* c[i] = a[i] @ op(b[i]) for i < batch, row-major, f32; c is overwritten (beta = 0).
 * Element offsets are added to the base pointers (they are the binding's subspan offsets). */
typedef struct plex_matmul_args_t {
  const float* a;
  size_t a_offset;
  const float* b;
  size_t b_offset;
  float* c;
  size_t c_offset;
  size_t batch;
  size_t m;
  size_t n;
  size_t k;
  size_t flags;
} plex_matmul_args_t;

int plex_backend_matmul(const plex_matmul_args_t* args);

/* Optional: how many threads the vendor library may use per call. The runtime calls it with 1
 * after loading the plugin, and again from myelin.runtime.backends.set_backend_threads(n). */
PLEX_BACKEND_EXPORT void plex_backend_set_threads(int threads);

#ifdef __cplusplus
}
#endif

#endif /* PLEX_BACKEND_H_ */
