/* y = x @ W.T with integer products (W8A8, issue #50), for a weight stored as int8_kernel.c's: int8 codes q with
 * a float32 scale s (and, for affine formats, a float32 offset o) per group of `group` inputs of each output row,
 *     W[n, k] = q[n, k] * s[n, k / group] + o[n, k / group].
 *
 * Each activation row is rounded to int8 with one scale per row, xs = max |x| / 127 (qx = rint(x / xs) in
 * [-127, 127]), and then
 *     y[r, n] = xs[r] * ( sum_g s[n, g] * (sum_{k in g} qx[r, k] * q[n, k])     integer sums, exact in int32
 *                       + sum_g o[n, g] * (sum_{k in g} qx[r, k]) )
 * which is exactly the dequantised weights times the rounded row, up to float32's sums: the only rounding beyond
 * float32's is the activations' (|x - xs * qx| <= xs / 2 per element).  The offsets multiply the *rounded*
 * rows' group sums (as llama.cpp's q8 block sums): then the rounding meets the centred weights q * s + o; with
 * the float rows' sums it met q * s alone, which for Q4_K's codes 0..15 is all of one sign, and measured 3.5x
 * the error on the embedded model's MLP down projection.
 *
 * Why one scale per row rather than llama.cpp's per 32: with one scale per row the unsigned x signed product of
 * AVX512-VNNI (vpdpbusd: u8 x s8, four products summed into each int32 lane) takes the activations offset by
 * 128 (u8 = qx + 128), and the offset's contribution, 128 * sum q, is the weights' alone: it is subtracted in
 * integers by starting each lane's accumulator at -128 * (its four codes' sum), one vpdpbusd per weight vector
 * shared by every activation row (exact; no sign flip per pair of rows).  Per-block activation scales would put a
 * second per-lane float scale into every product.  The measured accuracy (docs/bench.md) decides whether a row
 * scale is enough.
 *
 * Two vector paths, chosen by what the compiler targets (-march=native):
 *   AVX512-VNNI: tiles of up to 4 weight rows x 4 activation rows; 64 codes a step; each int32 lane's sum
 *                (4 codes, one group) is converted to float32 and multiplied into one 16-wide float
 *                accumulator per (row, output) by its group's scale (groups of 16, 32 or a multiple of 64).
 *   AVX2:        the rounded activations widened to int16 once, the codes to int16 per weight row, vpmaddwd
 *                (int16 x int16 pairs into int32, no saturation, unlike vpmaddubsw's int16 sums of u8 x s8,
 *                which 255 x 128 x 2 overflows) over each group (a multiple of 16), then the group's scale.
 * In both, a (row, output) pair's sum is formed the same way whatever rows come with it: a batch equals each
 * row alone, bit for bit.  Built and called as int8_kernel.c is (steer_ui.model.int8).
 */
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define VNNI 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AVX2 1
#endif

#define TILE_W 4  /* weight rows a tile */
#define TILE_X 4  /* activation rows a tile */

/* One activation row rounded: its scale, its codes, and (affine weights) its codes' sums per group (exact). */
static float quantise_row(const float *x, int64_t k, int64_t group, int8_t *qx, float *xsum)
{
    float m = 0.0f;
    int bad = 0;
    for (int64_t j = 0; j < k; j++) {
        const float a = fabsf(x[j]);
        bad |= !(a <= 3.4e38f);  /* NaN or infinity */
        m = a > m ? a : m;
    }
    const float inv = m > 0.0f && !bad ? 127.0f / m : 0.0f;
    for (int64_t j = 0; j < k; j++) {
        float v = nearbyintf(x[j] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        qx[j] = (int8_t)v;
    }
    if (xsum)
        for (int64_t g = 0; g < k / group; g++) {
            int32_t s = 0;
            for (int64_t j = g * group; j < (g + 1) * group; j++) s += qx[j];
            xsum[g] = (float)s;
        }
    return bad ? NAN : m / 127.0f;
}

/* sum_g o[g] * xsum[g]: lanes of 16 (8 on AVX2) groups, then the lanes' sum; the same for every call */
static inline float offset_term(const float *o, const float *xsum, int64_t groups)
{
#if defined(VNNI)
    __m512 acc = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g += 16) {
        const __mmask16 m = groups - g >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (groups - g)) - 1u);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, o + g), _mm512_maskz_loadu_ps(m, xsum + g), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float t = 0.0f;
    for (int64_t g = 0; g < groups; g++) t += o[g] * xsum[g];
    return t;
#endif
}

#if defined(VNNI)
/* The group scales of the 16 int32 lanes of 64 codes starting at j (4 codes a lane). */
static inline __m512 lane_scales(const float *s, int64_t j, int64_t k, int64_t group, __m512i idx)
{
    if (group % 64 == 0) return _mm512_set1_ps(s[j / group]);
    const int64_t g0 = j / group, per = 64 / group, left = k / group - g0;
    const __mmask16 m = (__mmask16)((1u << (left < per ? left : per)) - 1u);
    return _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(m, s + g0));
}

/* nb weight rows (q, s: strides k and k / group) against `rows` activation rows xu (u8 = qx + 128, stride k):
 * dots[i][r] = sum_g s[i, g] * (integer sum of group g).  One accumulator per pair, 64 codes a step in order,
 * then the lanes' sum: nothing in it depends on nb or rows. */
static inline __attribute__((always_inline)) void tile_vnni(const int nb, const int rows, const int8_t *q,
        const float *s, int64_t k, int64_t group, const uint8_t *xu, float dots[TILE_W][TILE_X])
{
    const int64_t groups = k / group;
    const __m512i zero = _mm512_setzero_si512(), c128 = _mm512_set1_epi8((char)0x80);
    const __m512i idx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          group == 16 ? 2 : 3);
    __m512 acc[TILE_W][TILE_X];
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) acc[i][r] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; j += 64) {
        const __mmask64 m = k - j >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (k - j)) - 1);
        __m512i xv[TILE_X];
        for (int r = 0; r < rows; r++) xv[r] = _mm512_maskz_loadu_epi8(m, xu + r * k + j);
        for (int i = 0; i < nb; i++) {
            /* the codes two tiles ahead (the unembedding streams 167 MB of them) */
            _mm_prefetch((const char *)(q + (2 * TILE_W + i) * k + j), _MM_HINT_T0);
            const __m512i w = _mm512_maskz_loadu_epi8(m, q + i * k + j);
            /* -128 * (sum of each lane's four codes): the accumulator's start, so the u8 offset cancels exactly */
            const __m512i base = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c128, w));
            const __m512 sv = lane_scales(s + i * groups, j, k, group, idx);
            for (int r = 0; r < rows; r++)
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(base, xv[r], w)), sv, acc[i][r]);
        }
    }
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) dots[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}
#define TILE_FN(NB, R) tile_vnni(NB, R, q, s, k, group, (const uint8_t *)xq, dots)
#define SUPPORTED(group) ((group) == 16 || (group) == 32 || (group) % 64 == 0)
#define PATH 2
#elif defined(AVX2)
static inline float hsum8(__m256 v)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* As tile_vnni, from int16 activations (stride k): per group, vpmaddwd sums into int32 lanes, then the group's
 * scale into one 8-wide float accumulator per pair. */
static inline __attribute__((always_inline)) void tile_avx2(const int nb, const int rows, const int8_t *q,
        const float *s, int64_t k, int64_t group, const int16_t *xw, float dots[TILE_W][TILE_X])
{
    const int64_t groups = k / group;
    __m256 acc[TILE_W][TILE_X];
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) acc[i][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256i sum[TILE_W][TILE_X];
        for (int i = 0; i < nb; i++)
            for (int r = 0; r < rows; r++) sum[i][r] = _mm256_setzero_si256();
        for (int64_t j = g * group; j < (g + 1) * group; j += 16) {
            __m256i xv[TILE_X];
            for (int r = 0; r < rows; r++) xv[r] = _mm256_loadu_si256((const __m256i *)(xw + r * k + j));
            for (int i = 0; i < nb; i++) {
                _mm_prefetch((const char *)(q + (2 * TILE_W + i) * k + j), _MM_HINT_T0);
                const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + i * k + j)));
                for (int r = 0; r < rows; r++) sum[i][r] = _mm256_add_epi32(sum[i][r], _mm256_madd_epi16(w, xv[r]));
            }
        }
        for (int i = 0; i < nb; i++) {
            const __m256 sv = _mm256_set1_ps(s[i * groups + g]);
            for (int r = 0; r < rows; r++) acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i][r]), sv, acc[i][r]);
        }
    }
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) dots[i][r] = hsum8(acc[i][r]);
}
#define TILE_FN(NB, R) tile_avx2(NB, R, q, s, k, group, xw, dots)
#define SUPPORTED(group) ((group) % 16 == 0)
#define PATH 1
#else
static void tile_scalar(int nb, int rows, const int8_t *q, const float *s, int64_t k, int64_t group,
                        const int8_t *xq, float dots[TILE_W][TILE_X])
{
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t g = 0; g < k / group; g++) {
                int32_t sum = 0;
                for (int64_t j = g * group; j < (g + 1) * group; j++) sum += (int32_t)q[i * k + j] * xq[r * k + j];
                acc += (float)sum * s[i * (k / group) + g];
            }
            dots[i][r] = acc;
        }
}
#define TILE_FN(NB, R) tile_scalar(NB, R, q, s, k, group, xq, dots)
#define SUPPORTED(group) ((group) > 0)
#define PATH 0
#endif

/* nb and rows as constants in each call, so the accumulators live in registers */
#define CASE(NB, R) case (NB) * 8 + (R): TILE_FN(NB, R); break;
static void tile(int nb, int rows, const int8_t *q, const float *s, int64_t k, int64_t group, const int8_t *xq,
                 const int16_t *xw, float dots[TILE_W][TILE_X])
{
    (void)xq; (void)xw;
    switch (nb * 8 + rows) {
    CASE(1, 1) CASE(1, 2) CASE(1, 3) CASE(1, 4) CASE(2, 1) CASE(2, 2) CASE(2, 3) CASE(2, 4)
    CASE(3, 1) CASE(3, 2) CASE(3, 3) CASE(3, 4) CASE(4, 1) CASE(4, 2) CASE(4, 3) CASE(4, 4)
    default: break;
    }
}

/* Returns 0, or -1 when this build cannot take the shape (k not a multiple of group, or a group its vector path
 * does not handle): the caller then uses the float32 kernel. */
int w8a8_matmul(const float *x, int64_t rows, int64_t k, const int8_t *q, const float *scale,
                const float *offset, int64_t group, int64_t n_out, float *y, int threads)
{
    if (group <= 0 || k % group || !SUPPORTED(group) || rows <= 0) return rows == 0 ? 0 : -1;
    const int64_t groups = k / group;
    int8_t *xq = aligned_alloc(64, (size_t)((rows * k + 63) / 64 * 64));
    int16_t *xw = NULL;
    float *xs = malloc((size_t)rows * sizeof(float));
    float *xsum = offset ? malloc((size_t)(rows * groups) * sizeof(float)) : NULL;
    if (!xq || !xs || (offset && !xsum)) {
        free(xq); free(xs); free(xsum);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        xs[r] = quantise_row(x + r * k, k, group, xq + r * k, xsum ? xsum + r * groups : NULL);
#if defined(VNNI)
    for (int64_t e = 0; e < rows * k; e++) xq[e] = (int8_t)((uint8_t)xq[e] ^ 0x80u);  /* u8 = qx + 128 */
#elif defined(AVX2)
    xw = aligned_alloc(64, (size_t)((rows * k * 2 + 63) / 64 * 64));
    if (!xw) {
        free(xq); free(xs); free(xsum);
        return -1;
    }
    for (int64_t e = 0; e < rows * k; e++) xw[e] = xq[e];
#endif
    const int64_t tiles = (n_out + TILE_W - 1) / TILE_W;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n = TILE_W * t;
        const int nb = n_out - n < TILE_W ? (int)(n_out - n) : TILE_W;
        float dots[TILE_W][TILE_X];
        for (int64_t r0 = 0; r0 < rows; r0 += TILE_X) {
            const int nr = rows - r0 < TILE_X ? (int)(rows - r0) : TILE_X;
            tile(nb, nr, q + n * k, scale + n * groups, k, group, xq + r0 * k, xw ? xw + r0 * k : NULL, dots);
            for (int i = 0; i < nb; i++)
                for (int r = 0; r < nr; r++) {
                    float v = dots[i][r];
                    if (offset) v += offset_term(offset + (n + i) * groups, xsum + (r0 + r) * groups, groups);
                    y[(r0 + r) * n_out + n + i] = xs[r0 + r] * v;
                }
        }
    }
    free(xq); free(xw); free(xs); free(xsum);
    return 0;
}

/* 2: AVX512-VNNI, 1: AVX2, 0: plain C (which path this build runs) */
int w8a8_path(void)
{
    return PATH;
}
