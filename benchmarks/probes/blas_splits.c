/* MiniLM's batch-1 projections through OpenBLAS sgemm, as the BLAS backend could call them: one
 * call or split into column blocks (the backend's workgroups), B as stored ([n][k], transposed in
 * the call) or pre-transposed ([k][n]), and Q, K, V as one 1152-wide call (benchmarks/history.md,
 * "The BLAS backend at batch 1, op by op"). Each of T threads runs its own stream of calls on 24
 * distinct weights, so they come from memory as in the model; per variant it prints the median
 * and the best of 31 rounds (per matmul), for the slowest thread.
 *
 *   build: gcc -O2 blas_splits.c -I$OB/include -L$OB/lib -l:libscipy_openblas.so
 *          -Wl,-rpath,$OB/lib -lpthread -o blas_splits      (OB: scipy_openblas32's folder)
 *   run:   OPENBLAS_NUM_THREADS=1 ./blas_splits [T] [1: B pre-transposed]
 */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { WEIGHTS = 24, ROUNDS = 31, MAX_THREADS = 8 };
/* m, n, k, column blocks */
static const int SHAPES[][4] = {{128, 384, 384, 1},  {128, 384, 384, 2},  {128, 1536, 384, 1},
                                {128, 1536, 384, 2}, {128, 1536, 384, 8}, {128, 384, 1536, 1},
                                {128, 384, 1536, 2}, {128, 1152, 384, 1}, {128, 1152, 384, 2},
                                {128, 1152, 384, 6}};
static int pretransposed = 0;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

typedef struct {
  int m, n, k, blocks;
  double median, best;
} job_t;

static void* run(void* arg) {
  job_t* job = arg;
  const int m = job->m, n = job->n, k = job->k, per = job->n / job->blocks;
  float* a = malloc(sizeof(float) * m * k);
  float* c = malloc(sizeof(float) * m * n);
  float* b[WEIGHTS];
  for (int i = 0; i < m * k; ++i) a[i] = (float)(i % 7) * 0.1f;
  for (int w = 0; w < WEIGHTS; ++w) {
    b[w] = malloc(sizeof(float) * n * k);
    for (long i = 0; i < (long)n * k; ++i) b[w][i] = (float)((i + w) % 5) * 0.01f;
  }
  double t[ROUNDS];
  for (int r = 0; r < ROUNDS; ++r) {
    const double start = now();
    for (int w = 0; w < WEIGHTS; ++w) {
      for (int q = 0; q < job->blocks; ++q) {
        if (pretransposed) /* B [k][n]: a block is columns q*per.. of each row */
          scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, per, k, 1.0f, a, k,
                            b[w] + q * per, n, 0.0f, c + q * per, n);
        else /* B [n][k] as stored: a block is rows q*per.. of B */
          scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, per, k, 1.0f, a, k,
                            b[w] + (size_t)q * per * k, k, 0.0f, c + q * per, n);
      }
    }
    t[r] = (now() - start) / WEIGHTS;
  }
  qsort(t, ROUNDS, sizeof(double), by_value);
  job->median = t[ROUNDS / 2];
  job->best = t[0];
  for (int w = 0; w < WEIGHTS; ++w) free(b[w]);
  free(a);
  free(c);
  return NULL;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > MAX_THREADS) threads = 1;
  pretransposed = argc > 2 ? atoi(argv[2]) : 0;
  for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; ++s) {
    job_t jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    for (int i = 0; i < threads; ++i) {
      jobs[i] = (job_t){SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], SHAPES[s][3], 0, 0};
      pthread_create(&ids[i], NULL, run, &jobs[i]);
    }
    double median = 0, best = 0;
    for (int i = 0; i < threads; ++i) {
      pthread_join(ids[i], NULL);
      if (jobs[i].median > median) median = jobs[i].median;
      if (jobs[i].best > best) best = jobs[i].best;
    }
    printf("%s m=%d n=%d k=%d column blocks=%d threads=%d: median %.1f us, best %.1f us\n",
           pretransposed ? "B [k][n]" : "B [n][k]", SHAPES[s][0], SHAPES[s][1], SHAPES[s][2],
           SHAPES[s][3], threads, median * 1e6, best * 1e6);
  }
  return 0;
}
