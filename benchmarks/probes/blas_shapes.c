/* MiniLM's matmul shapes on one vendor BLAS, as the BLAS backend calls them: why MKL's packed
 * GEMM was measured before it was built (benchmarks/history.md, "MKL packed GEMM").
 *
 * Each of T threads (PLeX's layout: one vendor call per IREE worker, the library
 * single-threaded) runs its own stream of calls on 24 distinct weights, so the weights come from
 * memory as they do in the model (36 weights, 86 MiB). Per shape it reports the best per-call
 * time of: one sgemm; the call split in two row blocks (the backend's workgroups at batch 1: each
 * block packs all of B again); in two column blocks (each packs its half of B); and, with MKL,
 * sgemm_compute on B packed once ahead (cblas_sgemm_pack), with the packed size.
 *
 *   OpenBLAS: gcc -O2 blas_shapes.c -I$OB/include -L$OB/lib -l:libscipy_openblas.so
 *             -Wl,-rpath,$OB/lib -lpthread -o blas_shapes      (OB: scipy_openblas32's folder)
 *   MKL:      gcc -O2 -DUSE_MKL blas_shapes.c -I$INC -L$LIB -l:libmkl_intel_lp64.so.3
 *             -l:libmkl_sequential.so.3 -l:libmkl_core.so.3 -Wl,-rpath,$LIB -lpthread -lm -ldl
 *             (INC: mkl-include 2026.2.0's include folder, LIB: the lib folder of the mkl
 *             2026.2.0 wheel's data)
 *   run:      OPENBLAS_NUM_THREADS=1 ./blas_shapes T
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef USE_MKL
#include <mkl_cblas.h>
#define SGEMM cblas_sgemm
#define LIBRARY "MKL"
#else
#include <cblas.h>
#define SGEMM scipy_cblas_sgemm
#define LIBRARY "OpenBLAS"
#endif

enum { WEIGHTS = 24, REPEATS = 12, VARIANTS = 4 };
static const char* const NAMES[VARIANTS] = {"one call", "2 row blocks", "2 column blocks",
                                            "packed B"};
static const int SHAPES[][3] = {{128, 384, 384},  {128, 1536, 384}, {128, 384, 1536},
                                {256, 384, 384},  {256, 1536, 384}, {256, 384, 1536}};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef struct {
  int m, n, k;
  double best[VARIANTS];
  size_t packed_bytes;
} job_t;

static void gemm(int m, int n, int k, const float* a, const float* b, float* c, int ldc) {
  SGEMM(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, ldc);
}

static void* run(void* arg) {
  job_t* job = arg;
  const int m = job->m, n = job->n, k = job->k;
  float* a = malloc(sizeof(float) * m * k);
  float* c = malloc(sizeof(float) * m * n);
  float* b[WEIGHTS];
  for (int i = 0; i < m * k; ++i) a[i] = (float)(i % 7) * 0.1f;
  for (int j = 0; j < WEIGHTS; ++j) {
    b[j] = malloc(sizeof(float) * n * k);
    for (int i = 0; i < n * k; ++i) b[j][i] = (float)(i % 5) * 0.1f;
  }
#ifdef USE_MKL
  float* packed[WEIGHTS];
  job->packed_bytes = cblas_sgemm_pack_get_size(CblasBMatrix, m, n, k);
  for (int j = 0; j < WEIGHTS; ++j) {
    packed[j] = aligned_alloc(64, (job->packed_bytes + 63) / 64 * 64);
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, CblasTrans, m, n, k, 1.0f, b[j], k, packed[j]);
  }
#endif
  for (int v = 0; v < VARIANTS; ++v) job->best[v] = 0.0;
  for (int r = 0; r < REPEATS; ++r) {
    for (int v = 0; v < VARIANTS; ++v) { /* interleaved */
      const double t = now();
      for (int j = 0; j < WEIGHTS; ++j) {
        if (v == 0) {
          gemm(m, n, k, a, b[j], c, n);
        } else if (v == 1) {
          gemm(m / 2, n, k, a, b[j], c, n);
          gemm(m / 2, n, k, a + (size_t)(m / 2) * k, b[j], c + (size_t)(m / 2) * n, n);
        } else if (v == 2) {
          gemm(m, n / 2, k, a, b[j], c, n);
          gemm(m, n / 2, k, a, b[j] + (size_t)(n / 2) * k, c + n / 2, n);
        } else {
#ifdef USE_MKL
          cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, n, k, a, k,
                              packed[j], k, 0.0f, c, n);
#endif
        }
      }
      const double per_call = (now() - t) / WEIGHTS;
      if (job->best[v] == 0.0 || per_call < job->best[v]) job->best[v] = per_call;
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  printf("%s, %d thread(s), each its own calls; best ms per call of %d rounds\n", LIBRARY,
         threads, REPEATS);
  for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; ++s) {
    job_t jobs[16];
    pthread_t ids[16];
    for (int t = 0; t < threads && t < 16; ++t) {
      jobs[t] = (job_t){.m = SHAPES[s][0], .n = SHAPES[s][1], .k = SHAPES[s][2]};
      pthread_create(&ids[t], NULL, run, &jobs[t]);
    }
    for (int t = 0; t < threads && t < 16; ++t) pthread_join(ids[t], NULL);
    printf("%4d x %4d x %4d (thread 0):", SHAPES[s][0], SHAPES[s][1], SHAPES[s][2]);
    for (int v = 0; v < VARIANTS; ++v) {
#ifndef USE_MKL
      if (v == 3) continue;
#endif
      printf("  %s %.3f", NAMES[v], jobs[0].best[v] * 1e3);
    }
    if (jobs[0].packed_bytes)
      printf("  (packed B %.1f MiB, the weight %.2f MiB)", jobs[0].packed_bytes / 1048576.0,
             SHAPES[s][1] * (double)SHAPES[s][2] * 4 / 1048576.0);
    printf("\n");
  }
  return 0;
}
