/* y = x @ W.T for a weight stored as int8 codes with a float32 scale (and, for affine formats, a float32
 * offset) per group of `group` consecutive inputs of each output row:
 *     W[n, k] = q[n, k] * s[n, k / group] + o[n, k / group].
 * Activations, the dequantised weights and the sums are float32.  Each weight is dequantised in registers as
 * it is read (a multiply, then an add, each rounded: exactly the float32 weight a GGUF reader computes, so the
 * result is the float32 product up to the order of its sums) and used for up to four input rows at once.
 * Made for few input rows (decode steps, the slider's re-runs); the caller sends many rows to a BLAS on
 * dequantised slabs instead.
 *
 * Built at first use by steer_ui.model.int8 with the machine's C compiler (-O3 -march=native -fopenmp
 * -ffp-contract=off, so no multiply-add is fused behind our back) and called through ctypes, which releases
 * the GIL for the call.  With AVX2 and FMA the dot products use fused multiply-adds explicitly.
 */
#include <stdint.h>
#include <stddef.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VECTOR 1
#endif

#ifdef VECTOR
static float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#ifdef VECTOR
/* Eight weights of row q (group scale s, offset o, or none) as float32: a multiply, then an add. */
static inline __m256 weights8(const int8_t *q, __m256 s, __m256 o, int affine)
{
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))), s);
    return affine ? _mm256_add_ps(v, o) : v;
}

/* Up to four input rows (`rows`) against one weight row, dequantised in registers as it is read.  Every row's
 * sum is formed the same way whatever `rows` is (two accumulators, alternate blocks of 8, then the tail in
 * order), so a row's result does not depend on the rows sent with it: a batch of users equals each user
 * alone, bit for bit. */
static inline __attribute__((always_inline)) void dot_rows_n(const int8_t *q, const float *s, const float *o,
        int64_t k, int64_t group, const float *x, const int rows, float *out, int64_t stride, const float *w)
{
    __m256 a[4][2];
    for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    int64_t j = 0;
    if (group % 16 == 0) {
        for (int64_t g = 0; g < k / group; g++) {
            const __m256 vs = _mm256_set1_ps(s[g]), vo = _mm256_set1_ps(o ? o[g] : 0.0f);
            for (int64_t e = g * group + group; j < e; j += 16) {
                /* from `w` when the row was dequantised once for many input rows: the same values */
                const __m256 w0 = w ? _mm256_load_ps(w + j) : weights8(q + j, vs, vo, o != NULL);
                const __m256 w1 = w ? _mm256_load_ps(w + j + 8) : weights8(q + j + 8, vs, vo, o != NULL);
                for (int r = 0; r < rows; r++) {
                    a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + j), a[r][0]);
                    a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k + j + 8), a[r][1]);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        float acc = hsum(_mm256_add_ps(a[r][0], a[r][1]));
        for (int64_t i = j; i < k; i++) {
            const int64_t g = i / group;
            const float w = o ? (float)q[i] * s[g] + o[g] : (float)q[i] * s[g];
            acc += w * x[r * k + i];
        }
        out[r * stride] = acc;
    }
}
/* rows as a constant in each call, so the accumulators live in registers */
static void dot_rows(const int8_t *q, const float *s, const float *o, int64_t k, int64_t group, const float *x,
                     int rows, float *out, int64_t stride, const float *w)
{
    switch (rows) {
    case 1: dot_rows_n(q, s, o, k, group, x, 1, out, stride, w); break;
    case 2: dot_rows_n(q, s, o, k, group, x, 2, out, stride, w); break;
    case 3: dot_rows_n(q, s, o, k, group, x, 3, out, stride, w); break;
    default: dot_rows_n(q, s, o, k, group, x, 4, out, stride, w); break;
    }
}

/* Row q of the weight as float32 into w (only for groups of a multiple of 16, where dot_rows_n reads it). */
static void dequantise_row(const int8_t *q, const float *s, const float *o, int64_t k, int64_t group, float *w)
{
    for (int64_t g = 0; g < k / group; g++) {
        const __m256 vs = _mm256_set1_ps(s[g]), vo = _mm256_set1_ps(o ? o[g] : 0.0f);
        for (int64_t j = g * group; j < (g + 1) * group; j += 8) _mm256_store_ps(w + j, weights8(q + j, vs, vo, o != NULL));
    }
}
#else
static void dot_rows(const int8_t *q, const float *s, const float *o, int64_t k, int64_t group, const float *x,
                     int rows, float *out, int64_t stride, const float *w)
{
    (void)w;
    for (int r = 0; r < rows; r++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < k; i++) {
            const int64_t g = i / group;
            const float w = o ? (float)q[i] * s[g] + o[g] : (float)q[i] * s[g];
            acc += w * x[r * k + i];
        }
        out[r * stride] = acc;
    }
}
#endif

#define BUFFER_K 16384  /* widest row dequantised once for many input rows */

/* Returns 0, or -1 when k is not a multiple of group (the caller checks). */
int int8_matmul(const float *x, int64_t rows, int64_t k, const int8_t *q, const float *scale,
                const float *offset, int64_t group, int64_t n_out, float *y, int threads)
{
    if (group <= 0 || k % group) return -1;
    const int64_t groups = k / group;
#ifdef VECTOR
    const int buffered = rows > 8 && group % 16 == 0 && k <= BUFFER_K;  /* measured: dearer up to 8 rows */
#else
    const int buffered = 0;
#endif
#pragma omp parallel num_threads(threads)
    {
        float w[BUFFER_K] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < n_out; n++) {
            const int8_t *qn = q + n * k;
            const float *sn = scale + n * groups, *on = offset ? offset + n * groups : NULL;
#ifdef VECTOR
            if (buffered) dequantise_row(qn, sn, on, k, group, w);
#endif
            for (int64_t r = 0; r < rows; r += 4)
                dot_rows(qn, sn, on, k, group, x + r * k, rows - r < 4 ? (int)(rows - r) : 4, y + r * n_out + n,
                         n_out, buffered ? w : NULL);
        }
    }
    return 0;
}
