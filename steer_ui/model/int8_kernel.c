/* y = x @ W.T for a weight stored as int8 codes with a float32 scale (and, for affine formats, a float32
 * offset) per group of `group` consecutive inputs of each output row:
 *     W[n, k] = q[n, k] * s[n, k / group] + o[n, k / group].
 * Activations, the dequantised weights and the sums are float32.  Each weight is dequantised as it is read (a
 * multiply, then an add, each rounded: exactly the float32 weight a GGUF reader computes, so the result is the
 * float32 product up to the order of its sums) and used for several input rows at once.  Made for the few to
 * few dozen input rows of decode steps, the many-users batch and the slider's re-runs; the caller sends more
 * rows to a BLAS on dequantised slabs.
 *
 * Two vector paths, chosen by what the compiler targets (-march=native):
 *   AVX-512: tiles of up to 4 weight rows x 4 input rows, one 16-wide accumulator per pair; with more than
 *            4 input rows each tile of weight rows is dequantised once into a buffer and read from there.
 *   AVX2:    one weight row x up to 4 input rows, two 8-wide accumulators per row.
 * In both, the sum for one (input row, output) pair is formed the same way whatever rows are sent with it,
 * so a batch of users equals each user alone, bit for bit (the order differs between the two paths, and so
 * between machines, which is fine: one machine runs one path).
 *
 * Built at first use by steer_ui.model.int8 with the machine's C compiler (-O3 -march=native -fopenmp
 * -ffp-contract=off, so no multiply-add is fused behind our back) and called through ctypes, which releases
 * the GIL for the call.
 */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VECTOR 1
#endif
#if defined(__AVX512F__) && defined(VECTOR)
#define WIDE 1
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

#ifdef WIDE
#ifndef TILE_ROWS
#define TILE_ROWS 6
#endif
#ifndef PREFETCH_TILES
#define PREFETCH_TILES 2
#endif
/* Sixteen weights of row q (group scale s, offset o, or none) as float32: a multiply, then an add. */
static inline __m512 weights16(const int8_t *q, __m512 s, __m512 o, int affine)
{
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), s);
    return affine ? _mm512_add_ps(v, o) : v;
}

/* The four lane sums of A, B, C, D stored at out[0..3], each by _mm512_reduce_add_ps's own tree (lanes i and
 * i + 8, then i and i + 4, i and i + 2, i and i + 1; an add is commutative, so the sums are the same bits),
 * with the four trees sharing their shuffles and adds. */
static inline __attribute__((always_inline)) void reduce4(__m512 A, __m512 B, __m512 C, __m512 D, float *out)
{
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(A, B, 0x44), _mm512_shuffle_f32x4(A, B, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(C, D, 0x44), _mm512_shuffle_f32x4(C, D, 0xEE));
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));
    const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, s)));
}

/* nb weight rows (starting at q, s, o; row stride k codes, `groups` scales) against `rows` input rows x, into
 * out[r * n_out + i].  From `w` (nb dequantised rows, stride k) when the tile was dequantised once for many
 * input rows: the same values.  Per (row, output): one accumulator over blocks of 16 in order, then the
 * lanes' sum; nothing in it depends on nb or rows.  Needs group % 16 == 0. */
static inline __attribute__((always_inline)) void tile16(const int nb, const int rows, const int8_t *q,
        const float *s, const float *o, int64_t k, int64_t group, const float *x, float *out, int64_t n_out,
        const float *w)
{
    __m512 a[4][TILE_ROWS];
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) a[i][r] = _mm512_setzero_ps();
    const int64_t groups = k / group;
    for (int64_t g = 0; g < groups; g++) {
        __m512 vs[4], vo[4];
        if (!w)
            for (int i = 0; i < nb; i++) {
                vs[i] = _mm512_set1_ps(s[i * groups + g]);
                vo[i] = _mm512_set1_ps(o ? o[i * groups + g] : 0.0f);
            }
        if (!w) _mm_prefetch((const char *)(s + PREFETCH_TILES * 4 * groups + 16 * g), _MM_HINT_T0);
        for (int64_t j = g * group; j < (g + 1) * group; j += 16) {
            /* the codes PREFETCH_TILES tiles ahead, a cache line per step (a tile's 4k bytes over its k / 16
             * steps): measured, the hardware prefetcher alone left a one-row product at a third of the
             * memory's speed */
            if (!w) _mm_prefetch((const char *)(q + PREFETCH_TILES * 4 * k + 4 * j), _MM_HINT_T0);
            __m512 xv[TILE_ROWS];
            for (int r = 0; r < rows; r++) xv[r] = _mm512_loadu_ps(x + r * k + j);
            for (int i = 0; i < nb; i++) {
                const __m512 wv = w ? _mm512_load_ps(w + i * k + j)
                                    : weights16(q + i * k + j, vs[i], vo[i], o != NULL);
                for (int r = 0; r < rows; r++) a[i][r] = _mm512_fmadd_ps(wv, xv[r], a[i][r]);
            }
        }
    }
    if (nb == 4)
        for (int r = 0; r < rows; r++) reduce4(a[0][r], a[1][r], a[2][r], a[3][r], out + r * n_out);
    else
        for (int i = 0; i < nb; i++)
            for (int r = 0; r < rows; r++) out[r * n_out + i] = _mm512_reduce_add_ps(a[i][r]);
}

/* nb and rows as constants in each call, so the accumulators live in registers */
#define TILE(NB, R) case (NB) * 8 + (R): tile16(NB, R, q, s, o, k, group, x, out, n_out, w); break;
static void tile(int nb, int rows, const int8_t *q, const float *s, const float *o, int64_t k, int64_t group,
                 const float *x, float *out, int64_t n_out, const float *w)
{
    switch (nb * 8 + rows) {
    TILE(1, 1) TILE(1, 2) TILE(1, 3) TILE(1, 4) TILE(2, 1) TILE(2, 2) TILE(2, 3) TILE(2, 4)
    TILE(3, 1) TILE(3, 2) TILE(3, 3) TILE(3, 4) TILE(4, 1) TILE(4, 2) TILE(4, 3) TILE(4, 4)
    TILE(1, 5) TILE(1, 6) TILE(2, 5) TILE(2, 6) TILE(3, 5) TILE(3, 6) TILE(4, 5) TILE(4, 6)
    default: break;
    }
}

static void dequantise_row16(const int8_t *q, const float *s, const float *o, int64_t k, int64_t group, float *w)
{
    for (int64_t g = 0; g < k / group; g++) {
        const __m512 vs = _mm512_set1_ps(s[g]), vo = _mm512_set1_ps(o ? o[g] : 0.0f);
        _mm_prefetch((const char *)(s + PREFETCH_TILES * 4 * (k / group) + g), _MM_HINT_T0);
        for (int64_t j = g * group; j < (g + 1) * group; j += 16) {
            _mm_prefetch((const char *)(q + PREFETCH_TILES * 4 * k + j), _MM_HINT_T0);
            _mm512_store_ps(w + j, weights16(q + j, vs, vo, o != NULL));
        }
    }
}

/* The AVX-512 path (group % 16 == 0): tiles of 4 weight rows, split between the threads.  Many input rows go
 * in chunks of about CHUNK_BYTES of activations, each chunk against every tile: every tile reads the whole
 * chunk, which then stays in the core's cache (a 21-α sweep's 672 rows of 640 floats are 1.7 MB; read whole
 * for each tile of 4 weight rows they came from the shared cache at ~290-310 GF/s, in chunks at 360-390). */
#ifndef CHUNK_BYTES
#define CHUNK_BYTES (512 * 1024)
#endif
static void matmul16(const float *x, int64_t rows, int64_t k, const int8_t *q, const float *scale,
                     const float *offset, int64_t group, int64_t n_out, float *y, int threads)
{
    const int64_t groups = k / group, tiles = (n_out + 3) / 4;
    const int buffered = rows > 4;  /* the tile's weights are then read rows / 4 times: dequantise them once */
    int64_t chunk = rows;
    if (buffered) {
        chunk = CHUNK_BYTES / (k * (int64_t)sizeof(float)) / TILE_ROWS * TILE_ROWS;
        if (chunk < TILE_ROWS) chunk = TILE_ROWS;
    }
#pragma omp parallel num_threads(threads)
    {
        float *w = buffered ? aligned_alloc(64, (size_t)(4 * k) * sizeof(float)) : NULL;
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            const int64_t r1 = rows - r0 < chunk ? rows : r0 + chunk;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < tiles; t++) {
                const int64_t n = 4 * t;
                const int nb = n_out - n < 4 ? (int)(n_out - n) : 4;
                const int8_t *qn = q + n * k;
                const float *sn = scale + n * groups, *on = offset ? offset + n * groups : NULL;
                if (w)
                    for (int i = 0; i < nb; i++) dequantise_row16(qn + i * k, sn + i * groups, on ? on + i * groups : NULL, k, group, w + i * k);
                const int step = w ? TILE_ROWS : 4;  /* from the buffer, the registers hold more accumulators */
                for (int64_t r = r0; r < r1; r += step)
                    tile(nb, r1 - r < step ? (int)(r1 - r) : step, qn, sn, on, k, group, x + r * k,
                         y + r * n_out + n, n_out, w);
            }
        }
        free(w);
    }
}
#endif

#define BUFFER_K 16384  /* widest row dequantised once for many input rows */

/* Returns 0, or -1 when k is not a multiple of group (the caller checks). */
int int8_matmul(const float *x, int64_t rows, int64_t k, const int8_t *q, const float *scale,
                const float *offset, int64_t group, int64_t n_out, float *y, int threads)
{
    if (group <= 0 || k % group) return -1;
#ifdef WIDE
    if (group % 16 == 0) {
        matmul16(x, rows, k, q, scale, offset, group, n_out, y, threads);
        return 0;
    }
#endif
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

/* 1 when this build has the AVX-512 path: it beats a BLAS on dequantised slabs at every row count measured
 * (up to 672 rows), so the caller sends it every product; the AVX2 path only up to 64 rows. */
int int8_wide(void)
{
#ifdef WIDE
    return 1;
#else
    return 0;
#endif
}
