/* fedpriv's fused statistics kernel (loaded by fedpriv/algorithms/native.py; see kernels.py).
 *
 * For segments s in [s0, s1) with entries r in [indptr[s], indptr[s+1]):
 *     x_r = sqrt(max(w_r, 0)) * F[index[r]]          (w_r = 1 without weights; a NaN weight gives NaN)
 *     A_s = sum_r x_r x_r^T                          (d x d, symmetric)
 *     b_s = sum_r sqrt(max(w_r, 0)) * y_r * x_r      (y_r = 0 without targets)
 *     c_s = sum_r max(w_r, 0) * y_r^2
 * Weights and targets are read at entry ``order[r]`` when ``order`` is given, else at r.
 *
 * One pass: a chunk of a segment's rows is gathered, scaled and packed into an aligned buffer
 * that stays in the L1/L2 cache (b and c are accumulated while packing), then register-blocked
 * rank-k updates (R rows x CV vectors of accumulators, row scalars broadcast) compute the tiles
 * of A on or above the diagonal; the lower triangle is mirrored on output. Portable C with GCC
 * vector extensions: the vector width follows the compiler's target (-march=native).
 *
 * Returns 0, or -1 - r for the first entry r whose source row or order index is out of range
 * (nothing is read out of bounds), or -2^62 when a scratch buffer cannot be allocated.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#if defined(__AVX512F__)
#define VW 16
#define MAXACC 24
#elif defined(__AVX__)
#define VW 8
#define MAXACC 12
#else
#define VW 4
#define MAXACC 12
#endif
#define MAXR 12
#define ALIGN 64
#define CHUNK_BYTES 32768
#define PREFETCH 16

typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4)));

typedef void (*tile_fn)(const float *restrict P, long ld, long nk, int r0, int c0, float *restrict M, int first);

/* M[r0 + i][c0 + c*VW ...] (+)= sum_k P[k][r0 + i] * P[k][c0 + c*VW ...] */
#define TILE(R, CV)                                                                                 \
    static void tile_##R##_##CV(const float *restrict P, long ld, long nk, int r0, int c0,          \
                                float *restrict M, int first) {                                     \
        vf acc[R][CV];                                                                              \
        for (int i = 0; i < R; i++)                                                                 \
            for (int c = 0; c < CV; c++)                                                            \
                acc[i][c] = first ? (vf){0} : *(const vf *)(M + (long)(r0 + i) * ld + c0 + c * VW); \
        for (long k = 0; k < nk; k++) {                                                             \
            const float *p = P + k * ld;                                                            \
            vf x[CV];                                                                               \
            for (int c = 0; c < CV; c++) x[c] = *(const vf *)(p + c0 + c * VW);                     \
            for (int i = 0; i < R; i++) {                                                           \
                float s = p[r0 + i];                                                                \
                for (int c = 0; c < CV; c++) acc[i][c] += s * x[c];                                 \
            }                                                                                       \
        }                                                                                           \
        for (int i = 0; i < R; i++)                                                                 \
            for (int c = 0; c < CV; c++) *(vf *)(M + (long)(r0 + i) * ld + c0 + c * VW) = acc[i][c]; \
    }

#define TILES(CV) TILE(1, CV) TILE(2, CV) TILE(3, CV) TILE(4, CV) TILE(5, CV) TILE(6, CV) \
                  TILE(7, CV) TILE(8, CV) TILE(9, CV) TILE(10, CV) TILE(11, CV) TILE(12, CV)
TILES(1)
TILES(2)

static const tile_fn TILE_FNS[2][MAXR] = {
    {tile_1_1, tile_2_1, tile_3_1, tile_4_1, tile_5_1, tile_6_1, tile_7_1, tile_8_1, tile_9_1, tile_10_1, tile_11_1, tile_12_1},
    {tile_1_2, tile_2_2, tile_3_2, tile_4_2, tile_5_2, tile_6_2, tile_7_2, tile_8_2, tile_9_2, tile_10_2, tile_11_2, tile_12_2},
};

/* The tiles computed for A: column groups of cv vectors (a last group of one vector when the
   vector count is odd), row tiles of up to MAXACC / gv rows, only those reaching the diagonal
   (rows r0 < the group's last column). BODY sees gv, R, r0 and c0. */
#define FOR_EACH_TILE(d, ncv, cv, BODY)                                           \
    for (int c0 = 0; c0 < (ncv) * VW;) {                                          \
        const int gv = ((ncv) * VW - c0) >= (cv) * VW ? (cv) : 1;                 \
        const int rt = MAXACC / gv < MAXR ? MAXACC / gv : MAXR;                   \
        const int c1 = c0 + gv * VW;                                              \
        for (int r0 = 0; r0 < (d) && r0 < c1; r0 += rt) {                         \
            const int R = (int)((d) - r0) < rt ? (int)((d) - r0) : rt;            \
            BODY;                                                                 \
        }                                                                         \
        c0 = c1;                                                                  \
    }

int fedpriv_vector_width(void) { return VW; }

/* Multiply-adds the kernel executes per entry at width d: its tiles (padding lanes included),
   b's and c's (for benchmarks: executed work against the useful (d + 1)^2). */
int64_t fedpriv_multiply_adds_per_entry(int64_t d) {
    const long ld = (d + VW - 1) / VW * VW;
    const int ncv = (int)(ld / VW);
    const int cv = ncv >= 2 ? 2 : 1;
    int64_t total = ld + 1;
    FOR_EACH_TILE(d, ncv, cv, total += (int64_t)R * gv * VW);
    return total;
}

/* an ALIGN-aligned buffer of at least n floats (aligned_alloc wants a multiple of ALIGN) */
static float *alloc_floats(long n) { return aligned_alloc(ALIGN, (size_t)(n * 4 + ALIGN) / ALIGN * ALIGN); }

int64_t fedpriv_segment_stats(const float *F, int64_t n_src, int64_t d,
                              const int64_t *index, const int64_t *indptr, int64_t s0, int64_t s1,
                              const double *w, const double *y, const int64_t *order, int64_t n_wy,
                              float *A, float *b, float *c) {
    const long ld = (d + VW - 1) / VW * VW;
    const int ncv = (int)(ld / VW);
    long chunk = CHUNK_BYTES / (ld * 4);
    if (chunk < 16) chunk = 16;
    float *P = alloc_floats(chunk * ld);
    float *M = alloc_floats((d > 0 ? d : 1) * ld);
    float *bacc = alloc_floats(ld);
    int64_t status = 0;
    if (!P || !M || !bacc) {
        status = -((int64_t)1 << 62);
        goto done;
    }
    memset(P, 0, (size_t)chunk * ld * 4); /* padding columns d..ld-1 stay zero */
    const int cv = ncv >= 2 ? 2 : 1; /* vectors per column group */
    const long dfull = d / VW * VW;

    const int64_t e_end = indptr[s1];
    for (int64_t s = s0; s < s1; s++) {
        const int64_t e0 = indptr[s], e1 = indptr[s + 1];
        float *As = A + s * d * d;
        double cs = 0.0;
        memset(bacc, 0, (size_t)ld * 4);
        int first = 1;
        for (int64_t k0 = e0; k0 < e1; k0 += chunk) {
            const long nk = (long)((e1 - k0) < chunk ? (e1 - k0) : chunk);
            /* gather, scale and pack; accumulate b and c */
            for (long k = 0; k < nk; k++) {
                const int64_t r = k0 + k;
                if (r + PREFETCH < e_end) { /* across chunk and segment ends */
                    const int64_t rp = index[r + PREFETCH];
                    if ((uint64_t)rp < (uint64_t)n_src) {
                        const char *row = (const char *)(F + rp * d);
                        for (long off = 0; off < d * 4; off += 64) __builtin_prefetch(row + off);
                    }
                }
                const int64_t src = index[r];
                if ((uint64_t)src >= (uint64_t)n_src) {
                    status = -1 - r;
                    goto done;
                }
                int64_t at = r;
                if (order) {
                    at = order[r];
                    if ((uint64_t)at >= (uint64_t)n_wy) {
                        status = -1 - r;
                        goto done;
                    }
                }
                float sw = 1.0f;
                if (w) {
                    const double wr = w[at];
                    sw = wr > 0.0 ? (float)sqrt(wr) : (wr != wr ? NAN : 0.0f); /* NaN stays NaN: the reply check rejects it */
                }
                const float yr = y ? sw * (float)y[at] : 0.0f;
                cs += (double)yr * yr;
                const float *fr = F + src * d;
                float *pr = P + k * ld;
                long j = 0;
                for (; j < dfull; j += VW) {
                    vf v = *(const vfu *)(fr + j) * sw;
                    *(vf *)(pr + j) = v;
                    *(vf *)(bacc + j) += yr * v;
                }
                for (; j < d; j++) {
                    const float v = fr[j] * sw;
                    pr[j] = v;
                    bacc[j] += yr * v;
                }
            }
            /* tiles of A on or above the diagonal */
            FOR_EACH_TILE(d, ncv, cv, TILE_FNS[gv - 1][R - 1](P, ld, nk, r0, c0, M, first));
            first = 0;
        }
        if (e1 == e0) {
            memset(As, 0, (size_t)(d * d) * 4);
        } else {
            for (long i = 0; i < d; i++) {
                const float *Mi = M + i * ld;
                for (long j = i; j < d; j++) {
                    As[i * d + j] = Mi[j];
                    As[j * d + i] = Mi[j];
                }
            }
        }
        for (long j = 0; j < d; j++) b[s * d + j] = bacc[j];
        c[s] = (float)cs;
    }
done:
    free(P);
    free(M);
    free(bacc);
    return status;
}
