/* y = x @ W.T with integer products on int16 activations (W8A16, issue #50), for a weight stored as
 * int8_kernel.c's: int8 codes q, a float32 scale s (and, for affine formats, a float32 offset o) per group of
 * `group` inputs of each output row, W[n, k] = q[n, k] * s[n, k / group] + o[n, k / group].
 *
 * Each activation row is rounded to int16 with one scale per row, xs = max |x| / 32767 (qx = rint(x / xs) in
 * [-32767, 32767]): 258 times finer than W8A8's int8 rows, whose rounding failed the accuracy gate on the
 * embedded model.  Then
 *     y[r, n] = xs[r] * ( sum_g s[n, g] * (sum_{k in g} qx[r, k] * q[n, k])
 *                       + sum_g o[n, g] * (sum_{k in g} qx[r, k]) )
 * with the offsets multiplying the rounded rows' group sums, as in w8a8_kernel.c (exact in integers; the rounding
 * then meets the centred weights).
 *
 * Overflow: one product is at most 32767 * 128 = 4.19e6 (127 for GGUF's codes), so an int32 holds 512 of them.
 * Every path converts its int32 sums to float at each group's end and, inside a longer group (per-row rounded
 * weights: the group is the whole row), every 512 inputs, whatever the row count.
 *
 * Paths, chosen by what the compiler targets (-march=native):
 *   a packed weight (w8a16_packed_matmul, on a weight packed once by w8a16_pack; groups of a multiple of 4 up to
 *     64), at every row count: AMX's tiles take the integer sums, 16 outputs x up to 16 rows a group, where
 *     the CPU has them; else AVX-512 VNNI's vpdpbusd, 16 outputs a vector (below);
 *   AVX-512 (BW; VNNI's vpdpwssd where present, else vpmaddwd + vpaddd, the same integer sums):
 *     groups of 16 or 32 in rows of a multiple of four groups (GGUF's Q8_0, Q4_K, Q6_K here): four groups
 *     interleaved per 32-input vector (tile_quads), so one conversion and one multiply-add serve four groups;
 *     otherwise 32 codes widened per step, groups of 16 (two a vector, a scale per half) or a multiple of 32.
 *   AVX2: 16 codes a step, vpmaddwd, groups a multiple of 16.
 *   plain C: any group.
 * Each tile shares every widened weight vector among up to TILE_X activation rows (the many-rows win).  A
 * (row, output) pair's sum is formed the same way whatever rows come with it, so a batch equals each row alone,
 * bit for bit.  Built and called as int8_kernel.c is (steer_ui.model.int8).
 */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define WIDE 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define TILES 1
#endif
#if defined(TILES) || defined(__AVX512VNNI__)
#define PACKED 1   /* a weight packed once (w8a16_pack) serves every product: on AMX's tiles, else VNNI's */
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NARROW 1
#endif

/* measured on the unembedding (262,144 x 640, groups of 32; docs/bench.md): one weight row a tile beat two at one
 * activation row (0.90x today's int8 kernel against 0.69x) and matched it at 8 */
#define TILE_W 1   /* weight rows a tile (tile() has the cases for 1) */
#define TILE_X 8   /* activation rows a tile */
#define AHEAD 4    /* weight rows ahead that each step prefetches */
#define CHUNK 512  /* most inputs summed in int32 before the float conversion */

static inline int16_t code(float v, float to_code)
{
    const float c = nearbyintf(v * to_code);
    return (int16_t)(c > 32767.0f ? 32767.0f : c < -32767.0f ? -32767.0f : c);
}

/* One row rounded to int16: returns its scale (NaN when the row holds a NaN or an infinity, which then reaches
 * every output of the row); xsum (affine weights): the codes' sum per group, exact.  `quads` (the AVX-512 path's
 * layout for groups of 16 or 32): each block of four groups is stored interleaved, its every 32-input vector
 * holding 8 inputs of each group (vector t: inputs 8t..8t+7 of each, group by group); else in order. */
static float round_row(const float *x, int64_t k, int64_t group, int quads, int16_t *qx, float *xsum)
{
    float top = 0.0f;
    int finite = 1;
    for (int64_t j = 0; j < k; j++) {
        const float a = fabsf(x[j]);
        finite &= a <= 3.4e38f;
        top = a > top ? a : top;
    }
    const float to_code = top > 0.0f && finite ? 32767.0f / top : 0.0f;
    for (int64_t g = 0; g < k / group; g++) {
        const float *xg = x + g * group;
        int64_t total = 0;
        if (quads) {
            int16_t *to = qx + g / 4 * 4 * group + g % 4 * 8;
            for (int64_t t = 0; t < group / 8; t++)
                for (int e = 0; e < 8; e++) total += to[32 * t + e] = code(xg[8 * t + e], to_code);
        } else {
            for (int64_t e = 0; e < group; e++) total += qx[g * group + e] = code(xg[e], to_code);
        }
        if (xsum) xsum[g] = (float)total;
    }
    return finite ? top / 32767.0f : NAN;
}

#if defined(WIDE)
#if defined(__AVX512VNNI__)
#define DOT(sum, w, x) _mm512_dpwssd_epi32((sum), (w), (x))
#define PATH 3
#else
#define DOT(sum, w, x) _mm512_add_epi32((sum), _mm512_madd_epi16((w), (x)))
#define PATH 2
#endif

/* nb weight rows (q, s: strides k, k / group) against `rows` int16 rows xw (stride k): dots[i][r] =
 * sum over groups (and 512-input chunks) of scale * float(int32 sum), one 16-lane accumulator per pair */
static inline __attribute__((always_inline)) void tile_wide(const int nb, const int rows, const int8_t *q,
        const float *s, int64_t k, int64_t group, const int16_t *xw, float dots[TILE_W][TILE_X])
{
    const int64_t groups = k / group;
    __m512 acc[TILE_W][TILE_X];
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) acc[i][r] = _mm512_setzero_ps();
    if (group == 16) {
        /* lanes 0-7 hold group j/16, lanes 8-15 the next: each half gets its own scale */
        const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        for (int64_t j = 0; j < k; j += 32) {
            const __mmask32 m = k - j >= 32 ? ~(__mmask32)0 : (__mmask32)0xFFFF;
            __m512i xv[TILE_X];
            for (int r = 0; r < rows; r++) xv[r] = _mm512_maskz_loadu_epi16(m, xw + r * k + j);
            for (int i = 0; i < nb; i++) {
                _mm_prefetch((const char *)(q + (2 * TILE_W + i) * k + j), _MM_HINT_T0);
                const __m512i w = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, q + i * k + j));
                const __m512 sv = _mm512_permutexvar_ps(half, _mm512_maskz_loadu_ps(k - j >= 32 ? 3 : 1,
                                                                                   s + i * groups + j / 16));
                for (int r = 0; r < rows; r++)
                    acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT(_mm512_setzero_si512(), w, xv[r])), sv,
                                                acc[i][r]);
            }
        }
    } else {
        for (int64_t g = 0; g < groups; g++)
            for (int64_t c = g * group; c < (g + 1) * group; c += CHUNK) {
                const int64_t end = c + CHUNK < (g + 1) * group ? c + CHUNK : (g + 1) * group;
                __m512i sum[TILE_W][TILE_X];
                for (int i = 0; i < nb; i++)
                    for (int r = 0; r < rows; r++) sum[i][r] = _mm512_setzero_si512();
                for (int64_t j = c; j < end; j += 32) {
                    __m512i xv[TILE_X];
                    for (int r = 0; r < rows; r++) xv[r] = _mm512_loadu_si512((const void *)(xw + r * k + j));
                    for (int i = 0; i < nb; i++) {
                        _mm_prefetch((const char *)(q + (2 * TILE_W + i) * k + j), _MM_HINT_T0);
                        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + i * k + j)));
                        for (int r = 0; r < rows; r++) sum[i][r] = DOT(sum[i][r], w, xv[r]);
                    }
                }
                for (int i = 0; i < nb; i++) {
                    const __m512 sv = _mm512_set1_ps(s[i * groups + g]);
                    for (int r = 0; r < rows; r++)
                        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i][r]), sv, acc[i][r]);
                }
            }
    }
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) dots[i][r] = _mm512_reduce_add_ps(acc[i][r]);
}

/* Groups of 16 or 32, four groups a block (the row in placed()'s order): each block's vectors put 8 inputs of each
 * group into lanes 0-3, 4-7, 8-11, 12-15, so one chain of group / 8 integer dot products gives every lane a
 * partial sum of one group, and one conversion and one multiply-add (a scale per quarter) take the four groups:
 * per activation row 6 operations for 128 inputs (groups of 32), against 8 multiply-adds of the float kernel.
 * The weights are rearranged to match in registers (a qword permute, then widening), once per weight row and
 * block, for every activation row of the tile. */
static inline __attribute__((always_inline)) void tile_quads(const int nb, const int rows, const int8_t *q,
        const float *s, const float *o, int64_t k, int64_t group, const int16_t *xw, const float *xsum,
        float dots[TILE_W][TILE_X])
{
    const int64_t groups = k / group, block = 4 * group;
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    /* qwords of vectors (0, 1) and (2, 3): vector t takes qword t of each group (groups of 32: 4 qwords each,
     * over two 64-byte loads); groups of 16: 2 qwords each, one load */
    const __m512i pick01 = group == 32 ? _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13)
                                       : _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    const __m512i pick23 = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
    __m512 acc[TILE_W][TILE_X];
    __m128 off[TILE_W][TILE_X];  /* affine: the offsets times the rounded rows' group sums, four groups a step */
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) acc[i][r] = _mm512_setzero_ps(), off[i][r] = _mm_setzero_ps();
    for (int64_t b = 0; b < k; b += block) {
        __m512i w[TILE_W][4];
        __m512 sv[TILE_W];
        for (int i = 0; i < nb; i++) {
            const int8_t *qb = q + i * k + b;
            _mm_prefetch((const char *)(qb + AHEAD * k), _MM_HINT_T0);
            const __m512i lo = _mm512_loadu_si512((const void *)qb);
            __m512i p = group == 32 ? _mm512_permutex2var_epi64(lo, pick01, _mm512_loadu_si512((const void *)(qb + 64)))
                                    : _mm512_permutexvar_epi64(pick01, lo);
            w[i][0] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(p));
            w[i][1] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(p, 1));
            if (group == 32) {
                _mm_prefetch((const char *)(qb + AHEAD * k + 64), _MM_HINT_T0);
                p = _mm512_permutex2var_epi64(lo, pick23, _mm512_loadu_si512((const void *)(qb + 64)));
                w[i][2] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(p));
                w[i][3] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(p, 1));
            }
            sv[i] = _mm512_permutexvar_ps(quarter, _mm512_castps128_ps512(_mm_loadu_ps(s + i * groups + b / group)));
        }
        for (int r = 0; r < rows; r++) {
            const int16_t *xb = xw + r * k + b;
            const __m512i x0 = _mm512_loadu_si512((const void *)xb), x1 = _mm512_loadu_si512((const void *)(xb + 32));
            for (int i = 0; i < nb; i++) {
                __m512i sum = DOT(DOT(_mm512_setzero_si512(), w[i][0], x0), w[i][1], x1);
                if (group == 32)
                    sum = DOT(DOT(sum, w[i][2], _mm512_loadu_si512((const void *)(xb + 64))), w[i][3],
                              _mm512_loadu_si512((const void *)(xb + 96)));
                acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sv[i], acc[i][r]);
                if (o)
                    off[i][r] = _mm_fmadd_ps(_mm_loadu_ps(o + i * groups + b / group),
                                             _mm_loadu_ps(xsum + r * groups + b / group), off[i][r]);
            }
        }
    }
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) {
            __m128 t = _mm_add_ps(off[i][r], _mm_movehl_ps(off[i][r], off[i][r]));
            dots[i][r] = _mm512_reduce_add_ps(acc[i][r]) + _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
        }
}
#define QUADS(k, group) (((group) == 16 || (group) == 32) && (k) / (group) % 4 == 0)
/* a separate copy without offsets (o NULL as a constant): their accumulators then take no registers */
#define TILE_FN(NB, R) \
    (!quads ? tile_wide(NB, R, q, s, k, group, xw, dots) : o ? tile_quads(NB, R, q, s, o, k, group, xw, xsum, dots) \
                                                            : tile_quads(NB, R, q, s, NULL, k, group, xw, NULL, dots))
#define SUPPORTED(group) ((group) == 16 || (group) % 32 == 0)
#elif defined(NARROW)
static inline float lanes_sum(__m256 v)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* as tile_wide, 16 codes a step (vpmaddwd into 8 int32 lanes, then vpaddd) */
static inline __attribute__((always_inline)) void tile_narrow(const int nb, const int rows, const int8_t *q,
        const float *s, int64_t k, int64_t group, const int16_t *xw, float dots[TILE_W][TILE_X])
{
    const int64_t groups = k / group;
    __m256 acc[TILE_W][TILE_X];
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) acc[i][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++)
        for (int64_t c = g * group; c < (g + 1) * group; c += CHUNK) {
            const int64_t end = c + CHUNK < (g + 1) * group ? c + CHUNK : (g + 1) * group;
            __m256i sum[TILE_W][TILE_X];
            for (int i = 0; i < nb; i++)
                for (int r = 0; r < rows; r++) sum[i][r] = _mm256_setzero_si256();
            for (int64_t j = c; j < end; j += 16)
                for (int i = 0; i < nb; i++) {
                    _mm_prefetch((const char *)(q + (2 * TILE_W + i) * k + j), _MM_HINT_T0);
                    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + i * k + j)));
                    for (int r = 0; r < rows; r++)
                        sum[i][r] = _mm256_add_epi32(sum[i][r], _mm256_madd_epi16(
                            w, _mm256_loadu_si256((const __m256i *)(xw + r * k + j))));
                }
            for (int i = 0; i < nb; i++) {
                const __m256 sv = _mm256_set1_ps(s[i * groups + g]);
                for (int r = 0; r < rows; r++)
                    acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[i][r]), sv, acc[i][r]);
            }
        }
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) dots[i][r] = lanes_sum(acc[i][r]);
}
#define TILE_FN(NB, R) tile_narrow(NB, R, q, s, k, group, xw, dots)
#define SUPPORTED(group) ((group) % 16 == 0)
#define PATH 1
#else
static void tile_plain(int nb, int rows, const int8_t *q, const float *s, int64_t k, int64_t group,
                       const int16_t *xw, float dots[TILE_W][TILE_X])
{
    for (int i = 0; i < nb; i++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t g = 0; g < k / group; g++)
                for (int64_t c = g * group; c < (g + 1) * group; c += CHUNK) {
                    const int64_t end = c + CHUNK < (g + 1) * group ? c + CHUNK : (g + 1) * group;
                    int32_t sum = 0;
                    for (int64_t j = c; j < end; j++) sum += (int32_t)q[i * k + j] * xw[r * k + j];
                    acc += (float)sum * s[i * (k / group) + g];
                }
            dots[i][r] = acc;
        }
}
#define TILE_FN(NB, R) tile_plain(NB, R, q, s, k, group, xw, dots)
#define SUPPORTED(group) ((group) > 0)
#define PATH 0
#endif
#ifndef QUADS
#define QUADS(k, group) 0
#endif

/* nb and rows as constants in each call, so the accumulators live in registers */
#define CASE(NB, R) case (NB) * 16 + (R): TILE_FN(NB, R); break;
static void tile(int nb, int rows, const int8_t *q, const float *s, const float *o, int64_t k, int64_t group,
                 int quads, const int16_t *xw, const float *xsum, float dots[TILE_W][TILE_X])
{
    (void)quads; (void)o; (void)xsum;
    switch (nb * 16 + rows) {
    CASE(1, 1) CASE(1, 2) CASE(1, 3) CASE(1, 4) CASE(1, 5) CASE(1, 6) CASE(1, 7) CASE(1, 8)
    default: break;
    }
}

/* AMX (Intel's tile unit, Sapphire Rapids and later): one instruction multiplies up to 16 activation rows of
 * `group` int8 codes by 16 weight rows, into 16 x 16 int32 sums.  For it a weight is packed once (w8a16_pack):
 * per 16 outputs and group, the codes as the tile takes them (group / 4 rows of 64 bytes, byte 4 n + j of row t
 * holding input 4 t + j of output n: 512 bytes for a group of 32, read in order as the product streams), and the
 * 16 outputs' scales (and offsets) for the group side by side, one vector.  An int16 code v splits exactly into
 * bytes, v = 256 hi + lo (hi signed, lo unsigned), each byte row one tile product (TDPBSSD, TDPBUSD); (hi sum << 8)
 * + lo sum is the group's int32 sum, exact (|hi sum| <= 64 * 128 * 128 for groups up to 64: shifted, < 2^31).
 * Each row's 16 sums then take their scales in one multiply-add, a vector over the outputs, and every (row,
 * output) pair's float sum runs over the groups in order, whatever rows come with it: a batch equals each row
 * alone, bit for bit, and with a packed weight this path takes every row count. */
#if defined(TILES)
#define XTILEDATA 18
#define REQ_XCOMP_PERM 0x1023

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* whether this process may use the tiles (Linux grants them on request, per process): 1 or 0 */
static int tiles_granted(void)
{
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, REQ_XCOMP_PERM, XTILEDATA) == 0;
    return granted;
}
#endif

#if defined(PACKED)
/* One row rounded to int16 as round_row() does it (the same codes: nearbyint under the default rounding, clamped
 * to +-32767), in 16-lane vectors, written straight as the tiles' bytes: hi = v >> 8 (signed), lo = v & 0xFF.
 * xsum (affine weights): the codes' sum per group, exact; hisum (VNNI's path): the high bytes' sum per group.
 * Returns the row's scale, NaN for a non-finite row. */
static float row_bytes(const float *x, int64_t k, int64_t group, uint8_t *hi, uint8_t *lo, float *xsum,
                       int32_t *hisum)
{
    __m512 top = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int64_t j = 0; j < k; j += 16) {
        const __mmask16 m = k - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - j)) - 1);
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + j));
        bad |= _mm512_mask_cmp_ps_mask(m, a, _mm512_set1_ps(3.4e38f), _CMP_NLE_UQ);  /* inf or NaN */
        top = _mm512_max_ps(top, a);
    }
    const float most = _mm512_reduce_max_ps(top);
    const float to_code = most > 0.0f && !bad ? 32767.0f / most : 0.0f;
    const __m512 scale = _mm512_set1_ps(to_code), ceiling = _mm512_set1_ps(32767.0f);
    const int vector_sums = group % 16 == 0;
    for (int64_t g = 0; xsum && g < k / group; g++) xsum[g] = 0.0f;
    for (int64_t g = 0; hisum && g < k / group; g++) hisum[g] = 0;
    for (int64_t j = 0; j < k; j += 16) {
        const __mmask16 m = k - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - j)) - 1);
        __m512 c = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), scale),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        c = _mm512_min_ps(_mm512_max_ps(c, _mm512_sub_ps(_mm512_setzero_ps(), ceiling)), ceiling);
        const __m512i v = _mm512_cvtps_epi32(c);
        _mm_mask_storeu_epi8(hi + j, m, _mm512_cvtepi32_epi8(_mm512_srai_epi32(v, 8)));
        _mm_mask_storeu_epi8(lo + j, m, _mm512_cvtepi32_epi8(_mm512_and_si512(v, _mm512_set1_epi32(0xFF))));
        if (xsum && vector_sums) xsum[j / group] += (float)_mm512_reduce_add_epi32(v);
        if (hisum && vector_sums) hisum[j / group] += _mm512_reduce_add_epi32(_mm512_srai_epi32(v, 8));
    }
    if (xsum && !vector_sums)
        for (int64_t j = 0; j < k; j++) xsum[j / group] += (float)((int8_t)hi[j] * 256 + lo[j]);
    if (hisum && !vector_sums)
        for (int64_t j = 0; j < k; j++) hisum[j / group] += (int8_t)hi[j];
    return bad ? NAN : most / 32767.0f;
}

/* One group of one row, 16 outputs: its exact int32 sums of the high bytes (``top``, corrected) and the low
 * bytes made one, scaled into the row's float accumulator (and the offsets times the group's code sum,
 * ``xsum_g``, where the weight is affine).  Both packed paths end every group here, so their results are the
 * same bits wherever their integer sums are. */
static inline __m512 group_sum(__m512 acc, __m512i top, __m512i low, __m512 sv, __m512 ov, const float *xsum_g)
{
    const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(top, 8), low);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), sv, acc);
    return xsum_g ? _mm512_fmadd_ps(_mm512_set1_ps(*xsum_g), ov, acc) : acc;
}
#endif

/* Which path takes products on packed weights in this build and process: 2 AMX's tiles (the CPU has them and
 * Linux granted them), 1 AVX-512 VNNI, 0 none (weights stay unpacked). */
int w8a16_packed_path(void)
{
#if defined(TILES)
    if (tiles_granted()) return 2;
#endif
#if defined(PACKED) && defined(__AVX512VNNI__)
    return 1;
#else
    return 0;
#endif
}

/* The packed form's sizes for an (n_out, k) weight in groups of `group`, or 0 where this build or process cannot
 * take it (no packed path, or a group it does not fit): codes bytes, and floats for the scales (the offsets too). */
int64_t w8a16_packed_bytes(int64_t n_out, int64_t k, int64_t group)
{
    if (group >= 4 && group <= 64 && group % 4 == 0 && k % group == 0 && n_out > 0 && w8a16_packed_path())
        return (n_out + 15) / 16 * 16 * k;
    return 0;
}

/* Packs q (and s, o: o may be NULL) into qp (w8a16_packed_bytes bytes), sp and op (bytes / group floats each);
 * outputs past n_out are zeros. */
void w8a16_pack(const int8_t *q, const float *s, const float *o, int64_t n_out, int64_t k, int64_t group,
                int8_t *qp, float *sp, float *op)
{
    const int64_t groups = k / group, tiles = (n_out + 15) / 16;
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t g = 0; g < groups; g++) {
            int8_t *block = qp + (t * groups + g) * 16 * group;
            float *sv = sp + (t * groups + g) * 16, *ov = op ? op + (t * groups + g) * 16 : NULL;
            for (int64_t n = 0; n < 16; n++) {
                const int64_t row = 16 * t + n;
                const int real = row < n_out;
                sv[n] = real ? s[row * groups + g] : 0.0f;
                if (ov) ov[n] = real && o ? o[row * groups + g] : 0.0f;
                for (int64_t e = 0; e < group; e++)
                    block[e / 4 * 64 + n * 4 + e % 4] = real ? q[row * k + g * group + e] : 0;
            }
        }
}

#if defined(TILES)
/* y = x @ W.T on a packed weight, on the tiles; returns 0, or -1 (memory). */
static int tiles_matmul(const float *x, int64_t rows, int64_t k, const int8_t *qp, const float *sp, const float *op,
                        int64_t group, int64_t n_out, float *y, int threads)
{
    const int64_t groups = k / group, tiles = (n_out + 15) / 16;
    /* the activations' bytes in blocks of `tall` rows, as even as 16 rows a block allows, the last padded with
     * zeros, so that one tile shape serves every block */
    const int tall = (int)((rows + (rows + 15) / 16 - 1) / ((rows + 15) / 16));  /* 24 rows: two blocks of 12 */
    const int64_t padded = (rows + tall - 1) / tall * tall;
    uint8_t *hi = malloc((size_t)(padded * k)), *lo = malloc((size_t)(padded * k));
    float *xs = malloc((size_t)rows * sizeof(float));
    float *xsum = op ? malloc((size_t)(rows * groups) * sizeof(float)) : NULL;
    if (!hi || !lo || !xs || (op && !xsum)) {
        free(hi); free(lo); free(xs); free(xsum);
        return -1;
    }
    memset(hi + rows * k, 0, (size_t)((padded - rows) * k));
    memset(lo + rows * k, 0, (size_t)((padded - rows) * k));
    /* tiles 0 and 1: the activations' bytes (`tall` rows of a group), 2: the weights, 3 and 4: the sums */
    struct tile_config config = {0};
    config.palette = 1;
    config.rows[0] = config.rows[1] = (uint8_t)tall, config.colsb[0] = config.colsb[1] = (uint16_t)group;
    config.rows[2] = (uint8_t)(group / 4), config.colsb[2] = 64;
    config.rows[3] = config.rows[4] = (uint8_t)tall, config.colsb[3] = config.colsb[4] = 64;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            xs[r] = row_bytes(x + r * k, k, group, hi + r * k, lo + r * k, xsum ? xsum + r * groups : NULL, NULL);
        _tile_loadconfig(&config);
        /* two buffers of each group's sums: a group's sums are read back one group later, while the tiles
         * multiply the next (reading a tile store at once waited for it) */
        int32_t top[2][16 * 16] __attribute__((aligned(64))), bottom[2][16 * 16] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t n = 16 * t;
            const int nb = n_out - n < 16 ? (int)(n_out - n) : 16;
            const __mmask16 keep = (__mmask16)((1u << nb) - 1);
            for (int64_t r0 = 0; r0 < rows; r0 += tall) {
                const int nr = rows - r0 < tall ? (int)(rows - r0) : tall;
                __m512 acc[16];
                for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
                for (int64_t g = 0; g <= groups; g++) {
                    if (g < groups) {
                        const int64_t at = (t * groups + g) * 16;
                        /* the next tile's block of this group (the packed codes stream in order) */
                        for (int64_t line = 0; line < 16 * group; line += 64)
                            _mm_prefetch((const char *)(qp + (at + 16 * groups) * group + line), _MM_HINT_T0);
                        _tile_loadd(0, hi + r0 * k + g * group, k);
                        _tile_loadd(1, lo + r0 * k + g * group, k);
                        _tile_loadd(2, qp + at * group, 64);
                        _tile_zero(3);
                        _tile_zero(4);
                        _tile_dpbssd(3, 0, 2);
                        _tile_dpbusd(4, 1, 2);
                        _tile_stored(3, top[g & 1], 64);
                        _tile_stored(4, bottom[g & 1], 64);
                    }
                    if (g == 0) continue;
                    /* the previous group's sums, in group order */
                    const int64_t was = g - 1, at = (t * groups + was) * 16;
                    const int32_t *ht = top[was & 1], *lt = bottom[was & 1];
                    const __m512 sv = _mm512_load_ps(sp + at);
                    const __m512 ov = op ? _mm512_load_ps(op + at) : sv;
                    for (int r = 0; r < nr; r++)
                        acc[r] = group_sum(acc[r], _mm512_load_si512(ht + 16 * r), _mm512_load_si512(lt + 16 * r),
                                           sv, ov, op ? xsum + (r0 + r) * groups + was : NULL);
                }
                for (int r = 0; r < nr; r++)
                    _mm512_mask_storeu_ps(y + (r0 + r) * n_out + n, keep,
                                          _mm512_mul_ps(_mm512_set1_ps(xs[r0 + r]), acc[r]));
            }
        }
        _tile_release();
    }
    free(hi); free(lo); free(xs); free(xsum);
    return 0;
}
#endif

#if defined(PACKED) && defined(__AVX512VNNI__)
/* The next tile's codes for group g into the L1 while this tile's are multiplied (``next`` NULL: nothing). */
static inline void prefetch_group(const int8_t *next, int64_t g, int64_t group)
{
    for (int64_t line = 0; next && line < 16 * group; line += 64)
        _mm_prefetch((const char *)(next + g * 16 * group + line), _MM_HINT_T0);
}

/* The end of one group of one row on VNNI's path: the high bytes' products less their correction, 128 times the
 * row's high bytes' sum over the group (``hisum_g``), then the shared epilogue. */
static inline __m512 vnni_group_end(__m512 acc, __m512i ah, __m512i al, const int32_t *hisum_g, __m512 sv,
                                    __m512 ov, const float *xsum_g)
{
    return group_sum(acc, _mm512_sub_epi32(ah, _mm512_set1_epi32(128 * hisum_g[0])), al, sv, ov, xsum_g);
}

/* VNNI's path on the packed weight (Zen 4, Ice Lake and later without the tiles): per 4 inputs, one 64-byte
 * vector holds the 16 outputs' codes, and each row's 4 high and 4 low bytes are broadcast to every output.
 * vpdpbusd multiplies unsigned bytes by signed ones, so the low bytes (unsigned) meet the codes as they are, and
 * the high bytes (signed) meet the codes + 128 (unsigned): sum(hi * (q + 128)) - 128 * sum(hi) = sum(hi * q),
 * exact, with the high bytes' group sum from row_bytes.  (hi sum << 8) + lo sum is then the group's int32 sum
 * as the tiles form it, and the epilogue is theirs, so the results are theirs bit for bit.  Products held per
 * 4 inputs: |hi| <= 128 times 255, four of them, 64 / 4 steps a group at most: < 2^22. */
static inline __attribute__((always_inline)) void vnni_rows(const int R, const int8_t *qt, const float *st,
        const float *ot, int64_t k, int64_t group, const uint8_t *hi, const uint8_t *lo, const int32_t *hisum,
        const float *xsum, const float *xs, float *y, int64_t n_out, __mmask16 keep, const int8_t *next)
{
    const int64_t groups = k / group, steps = group / 4;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *block = qt + g * 16 * group;
        prefetch_group(next, g, group);
        __m512i ah[8], al[8];
        for (int r = 0; r < R; r++) ah[r] = al[r] = _mm512_setzero_si512();
        for (int64_t e = 0; e < steps; e++) {
            const __m512i w = _mm512_loadu_si512((const void *)(block + 64 * e));
            const __m512i wu = _mm512_xor_si512(w, flip);
            for (int r = 0; r < R; r++) {
                int32_t h4, l4;
                memcpy(&h4, hi + r * k + g * group + 4 * e, 4);
                memcpy(&l4, lo + r * k + g * group + 4 * e, 4);
                ah[r] = _mm512_dpbusd_epi32(ah[r], wu, _mm512_set1_epi32(h4));
                al[r] = _mm512_dpbusd_epi32(al[r], _mm512_set1_epi32(l4), w);
            }
        }
        const __m512 sv = _mm512_loadu_ps(st + g * 16);
        const __m512 ov = ot ? _mm512_loadu_ps(ot + g * 16) : sv;
        for (int r = 0; r < R; r++)
            acc[r] = vnni_group_end(acc[r], ah[r], al[r], hisum + r * groups + g, sv, ov,
                                    ot ? xsum + r * groups + g : NULL);
    }
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(y + r * n_out, keep, _mm512_mul_ps(_mm512_set1_ps(xs[r]), acc[r]));
}

/* vnni_rows for groups of 4 * STEPS inputs (STEPS 4 or 8: Q6_K's 16, the 32 of Q4_K, Q5_0 and Q8_0), the same
 * integer sums and the same epilogue, so the same bits: a group's codes are loaded once into registers (with their
 * flipped copy), then each row in turn meets them, its two accumulators alone in flight.  With the rows innermost
 * (vnni_rows) GCC 12 copied the accumulators between every two products and spilled the codes to the stack; held,
 * the block products at 8-24 rows took 0.76-0.87 of the time (kernel_ab --w8a16-old, equal bits).  Under
 * HELD_ROWS rows vnni_rows stays: streaming the unembedding's codes from memory at 1 and 3 rows, the held loop
 * took 1.47 times as long. */
static inline __attribute__((always_inline)) void vnni_rows_held(const int R, const int STEPS, const int8_t *qt,
        const float *st, const float *ot, int64_t k, int64_t group, const uint8_t *hi, const uint8_t *lo,
        const int32_t *hisum, const float *xsum, const float *xs, float *y, int64_t n_out, __mmask16 keep,
        const int8_t *next)
{
    const int64_t groups = k / group;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[8];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int8_t *block = qt + g * 16 * group;
        prefetch_group(next, g, group);
        __m512i w[8], wu[8];
        for (int e = 0; e < STEPS; e++) {
            w[e] = _mm512_loadu_si512((const void *)(block + 64 * e));
            wu[e] = _mm512_xor_si512(w[e], flip);
        }
        const __m512 sv = _mm512_loadu_ps(st + g * 16);
        const __m512 ov = ot ? _mm512_loadu_ps(ot + g * 16) : sv;
        for (int r = 0; r < R; r++) {
            __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
            const uint8_t *h = hi + r * k + g * group, *l = lo + r * k + g * group;
            for (int e = 0; e < STEPS; e++) {
                int32_t h4, l4;
                memcpy(&h4, h + 4 * e, 4);
                memcpy(&l4, l + 4 * e, 4);
                ah = _mm512_dpbusd_epi32(ah, wu[e], _mm512_set1_epi32(h4));
                al = _mm512_dpbusd_epi32(al, _mm512_set1_epi32(l4), w[e]);
            }
            acc[r] = vnni_group_end(acc[r], ah, al, hisum + r * groups + g, sv, ov, ot ? xsum + r * groups + g : NULL);
        }
    }
    for (int r = 0; r < R; r++)
        _mm512_mask_storeu_ps(y + r * n_out, keep, _mm512_mul_ps(_mm512_set1_ps(xs[r]), acc[r]));
}

#define HELD_ROWS 4 /* row blocks this tall and taller hold a group's codes in registers (vnni_rows_held) */
static int vnni_matmul(const float *x, int64_t rows, int64_t k, const int8_t *qp, const float *sp, const float *op,
                       int64_t group, int64_t n_out, float *y, int threads)
{
    const int64_t groups = k / group, tiles = (n_out + 15) / 16;
    /* rows in blocks of up to 8 (each row's accumulators stay in registers), as even as that allows */
    const int blocks = (int)((rows + 7) / 8), tall = (int)((rows + blocks - 1) / blocks);
    /* up to 8 tiles a chunk (80 KB of codes at 640 inputs, in the L2), fewer where the chunks would not spread
     * over the threads (640 outputs are 40 tiles) */
    int64_t chunk = tiles / (4 * (int64_t)(threads > 0 ? threads : 1));
    chunk = chunk < 1 ? 1 : chunk > 8 ? 8 : chunk;
    const int64_t chunks = (tiles + chunk - 1) / chunk;
    uint8_t *hi = malloc((size_t)(rows * k)), *lo = malloc((size_t)(rows * k));
    float *xs = malloc((size_t)rows * sizeof(float));
    int32_t *hisum = malloc((size_t)(rows * groups) * sizeof(int32_t));
    float *xsum = op ? malloc((size_t)(rows * groups) * sizeof(float)) : NULL;
    if (!hi || !lo || !xs || !hisum || (op && !xsum)) {
        free(hi); free(lo); free(xs); free(hisum); free(xsum);
        return -1;
    }
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            xs[r] = row_bytes(x + r * k, k, group, hi + r * k, lo + r * k, xsum ? xsum + r * groups : NULL,
                              hisum + r * groups);
        /* a chunk of tiles at a time, its row blocks outside: the chunk's codes (10 KB a tile for 640 inputs) come
         * from the L2 for the second and later blocks, while one block's bytes stay in the L1 (all 24 rows' are
         * 30 KB, which with a tile's codes overflowed Zen 4's 32 KB L1 when every block ran over one tile) */
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++)
            for (int64_t r0 = 0; r0 < rows; r0 += tall) {
                const int nr = rows - r0 < tall ? (int)(rows - r0) : tall;
                for (int64_t t = c * chunk; t < tiles && t < (c + 1) * chunk; t++) {
                    const int64_t n = 16 * t;
                    const int nb = n_out - n < 16 ? (int)(n_out - n) : 16;
                    const __mmask16 keep = (__mmask16)((1u << nb) - 1);
                    const int8_t *qt = qp + t * groups * 16 * group;
                    /* the first block streams the codes from memory: it prefetches the next tile's */
                    const int8_t *next = r0 == 0 && t + 1 < tiles ? qt + groups * 16 * group : NULL;
#define VNNI_ARGS qt, sp + t * groups * 16, op ? op + t * groups * 16 : NULL, k, group, hi + r0 * k, lo + r0 * k, \
                  hisum + r0 * groups, xsum ? xsum + r0 * groups : NULL, xs + r0, y + r0 * n_out + n, n_out, keep, next
#define VNNI_ROWS(R) (R >= HELD_ROWS && group == 32 ? vnni_rows_held(R, 8, VNNI_ARGS) \
                      : R >= HELD_ROWS && group == 16 ? vnni_rows_held(R, 4, VNNI_ARGS) : vnni_rows(R, VNNI_ARGS))
                    switch (nr) {
                    case 1: VNNI_ROWS(1); break;
                    case 2: VNNI_ROWS(2); break;
                    case 3: VNNI_ROWS(3); break;
                    case 4: VNNI_ROWS(4); break;
                    case 5: VNNI_ROWS(5); break;
                    case 6: VNNI_ROWS(6); break;
                    case 7: VNNI_ROWS(7); break;
                    default: VNNI_ROWS(8); break;
                    }
#undef VNNI_ROWS
#undef VNNI_ARGS
                }
            }
    }
    free(hi); free(lo); free(xs); free(hisum); free(xsum);
    return 0;
}
#endif
/* y = x @ W.T on a weight packed by w8a16_pack (the tiles where granted, else VNNI's path: the same integer sums,
 * the same float epilogue, so the same bits); returns 0, or -1 (no packed path here, a shape it does not take,
 * or memory). */
int w8a16_packed_matmul(const float *x, int64_t rows, int64_t k, const int8_t *qp, const float *sp, const float *op,
                        int64_t group, int64_t n_out, float *y, int threads)
{
    if (rows <= 0) return rows == 0 ? 0 : -1;
    if (!w8a16_packed_bytes(n_out, k, group)) return -1;
#if defined(TILES)
    if (w8a16_packed_path() == 2) return tiles_matmul(x, rows, k, qp, sp, op, group, n_out, y, threads);
#endif
#if defined(PACKED) && defined(__AVX512VNNI__)
    return vnni_matmul(x, rows, k, qp, sp, op, group, n_out, y, threads);
#else
    (void)x; (void)qp; (void)sp; (void)op; (void)y; (void)threads;
    return -1;
#endif
}

/* Returns 0, or -1 when this build cannot take the shape (k not a multiple of group, a group its vector path
 * does not handle, memory): the caller then keeps the float32 kernel. */
int w8a16_matmul(const float *x, int64_t rows, int64_t k, const int8_t *q, const float *scale,
                 const float *offset, int64_t group, int64_t n_out, float *y, int threads)
{
    if (group <= 0 || k % group || !SUPPORTED(group) || rows <= 0) return rows == 0 ? 0 : -1;
    const int64_t groups = k / group;
    const int quads = QUADS(k, group);
    int16_t *xw = aligned_alloc(64, (size_t)((rows * k * 2 + 63) / 64 * 64));
    float *xs = malloc((size_t)rows * sizeof(float));
    float *xsum = offset ? malloc((size_t)(rows * groups) * sizeof(float)) : NULL;
    if (!xw || !xs || (offset && !xsum)) {
        free(xw); free(xs); free(xsum);
        return -1;
    }
    for (int64_t r = 0; r < rows; r++)
        xs[r] = round_row(x + r * k, k, group, quads, xw + r * k, xsum ? xsum + r * groups : NULL);
    const int64_t tiles = (n_out + TILE_W - 1) / TILE_W;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n = TILE_W * t;
        const int nb = n_out - n < TILE_W ? (int)(n_out - n) : TILE_W;
        float dots[TILE_W][TILE_X];
        for (int64_t r0 = 0; r0 < rows; r0 += TILE_X) {
            const int nr = rows - r0 < TILE_X ? (int)(rows - r0) : TILE_X;
            /* the interleaved tile adds the offsets' term itself, four groups a step */
            tile(nb, nr, q + n * k, scale + n * groups, offset ? offset + n * groups : NULL, k, group, quads,
                 xw + r0 * k, xsum ? xsum + r0 * groups : NULL, dots);
            for (int i = 0; i < nb; i++)
                for (int r = 0; r < nr; r++) {
                    float v = dots[i][r];
                    /* affine: the offsets times the rounded row's group sums, in group order */
                    for (int64_t g = 0; offset && !quads && g < groups; g++)
                        v += offset[(n + i) * groups + g] * xsum[(r0 + r) * groups + g];
                    y[(r0 + r) * n_out + n + i] = xs[r0 + r] * v;
                }
        }
    }
    free(xw); free(xs); free(xsum);
    return 0;
}

/* 3: AVX-512 with VNNI, 2: AVX-512 (BW) without, 1: AVX2, 0: plain C (which path this build runs) */
int w8a16_path(void)
{
    return PATH;
}
