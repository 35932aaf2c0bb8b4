/* PLeX external backend ABI, version 2 (2 added plex_matmul_args_t.ld).
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

#define PLEX_BACKEND_ABI_VERSION 2

#define PLEX_BACKEND_EXPORT __attribute__((visibility("default")))

/* matmul flags */
#define PLEX_MATMUL_TRANSPOSE_B 1u /* b holds [batch][n][k] (else [batch][k][n]) */
#define PLEX_MATMUL_SHARED_B 2u    /* one b for every batch (b has no batch dimension) */

/* c[i] = a[i] @ op(b[i]) for i < batch, row-major, f32; c is overwritten (beta = 0).
 * Element offsets are added to the base pointers (they are the binding's subspan offsets).
 * `ld` is the op's whole n: the row stride of c, and of b where b is [k][n]. A call may get a
 * block of the op's columns (n < ld: c and b start at the block, the strides stay ld), of its
 * rows, or of its batches. */
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
  size_t ld;
} plex_matmul_args_t;

/* attention flags: which mask `mask` points to (with neither, `mask` is not read), and the
 * layouts of q, k, v and the mask */
#define PLEX_ATTENTION_MASK_BOOL 1u /* bytes: 0 masks the score out */
#define PLEX_ATTENTION_MASK_ADD 2u  /* f32 added to the scaled score */
/* q, k, v are [batch / heads][len][heads][e] (a projection's output as it is, one row per
 * token, the heads side by side) instead of [batch][len][e] */
#define PLEX_ATTENTION_HEADS_INTERLEAVED 4u
/* the mask is [batch / heads][l][s], one for all heads of a batch, instead of [batch][l][s] */
#define PLEX_ATTENTION_MASK_PER_BATCH 8u

/* o[i] = softmax(scale * q[i] @ k[i]^T, masked) @ v[i] for first <= i < first + batch,
 * row-major f32: o is [batch][l][ev] from the call's offset on (overwritten); q [l][e],
 * k [s][e] and v [s][ev] per head i, where the flags say. The pointers plus offsets are the
 * whole operands (a call finds head i itself: `first` is where its slice starts). `scale_bits`
 * holds the f32 scale's bits in its low 32 bits (a dispatch passes only index operands). A
 * masked score is the lowest f32 (a fully masked row averages v, as IREE's decomposition). */
typedef struct plex_attention_args_t {
  const float* q;
  size_t q_offset;
  const float* k;
  size_t k_offset;
  const float* v;
  size_t v_offset;
  const void* mask;
  size_t mask_offset; /* in elements of the mask's type */
  float* o;
  size_t o_offset; /* where head `first`'s output starts */
  size_t first;
  size_t batch;
  size_t heads;
  size_t l;
  size_t s;
  size_t e;
  size_t ev;
  size_t scale_bits;
  size_t flags;
} plex_attention_args_t;

/* gelu flags */
#define PLEX_GELU_BIAS 1u /* add bias[n] to every row first */

/* y = x * 0.5 * (1 + erf(x / sqrt(2))) elementwise (the exact GELU), on x + bias where
 * PLEX_GELU_BIAS: rows x n, row-major f32, y overwritten. */
typedef struct plex_gelu_args_t {
  const float* x;
  size_t x_offset;
  const float* bias;
  size_t bias_offset;
  float* y;
  size_t y_offset;
  size_t rows;
  size_t n;
  size_t flags;
} plex_gelu_args_t;

/* A backend defines the op functions it declares in its package's `ops`; the others stay
 * undefined (weak here), and the plugin does not offer their imports. */
__attribute__((weak)) int plex_backend_matmul(const plex_matmul_args_t* args);
__attribute__((weak)) int plex_backend_attention(const plex_attention_args_t* args);
__attribute__((weak)) int plex_backend_gelu(const plex_gelu_args_t* args);

/* Optional: how many threads the vendor library may use per call. The runtime calls it with 1
 * after loading the plugin, and again from myelin.runtime.backends.set_backend_threads(n). */
PLEX_BACKEND_EXPORT void plex_backend_set_threads(int threads);

#ifdef __cplusplus
}
#endif

#endif /* PLEX_BACKEND_H_ */
