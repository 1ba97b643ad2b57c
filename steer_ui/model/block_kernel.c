/* One Gemma 3 decoder block on `rows` rows (one token each), in one call (issue #50).
 *
 * Through Hugging Face's modules a CPU decode step dispatched ~1,350 torch operators from Python, about as much
 * time as reading the weights (docs/bench.md, "Where a step's time goes"); here a block is one ctypes call:
 *
 *   x  = rms(h) · g_in;  q, k, v = x Wqᵀ, x Wkᵀ, x Wvᵀ;  q, k = rms per head · g_q / g_k;  rope(q, k)
 *   K[col], V[col] = k, v;  a = softmax(q·Kᵀ · scaling (soft-capped where the model caps)) V  over the row's
 *   columns [max(start, col − window + 1), col];  a += head_add (ITI's shift, where given)
 *   h += rms(a Woᵀ) · g_post_attn;  x = rms(h) · g_pre_ff;  h += rms(W_down (gelu_tanh(x Wgᵀ) ⊙ x Wuᵀ)) · g_post_ff
 *
 * A row names its own column and the store row whose keys and values it writes and reads: a decode step gives
 * every row the same column and a store row of its own; a pass over a prompt's positions (fused_pass.py) gives
 * each position a row of the same store row at its own column.  Every row's key and value are written before
 * any row attends, so a position sees the positions before it written in the same call.  The MLP can run on
 * some rows only (a pass reads the last position of the final block alone); the others keep the block's
 * attention half, as Hugging Face's modules leave them when fed one position (prefix.py).
 *
 * The products are int8_kernel.c's (the same function the torch path calls, so the same sums); the norms'
 * squares are summed in double, attention in float32.  Every row is computed alone (no sum runs across rows;
 * loops over many rows are shared between the threads a row each), so a request's result does not depend on
 * the rows beside it: the many-users batch stays exact.
 * Built like int8_kernel.c (-O3 -march=native -fopenmp -ffp-contract=off) and called through ctypes.
 */
#include "int8_kernel.c"
#include "exp_vec.h"
#include <math.h>
#include <string.h>

enum { G_IN, G_POST_ATTN, G_PRE_FF, G_POST_FF, G_Q, G_K, N_GAINS };
enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, N_WEIGHTS };

/* y = x / sqrt(mean x² + eps) · gain, for n values (HF's Gemma norm with its gain already 1 + w) */
static void rms(const float *x, const float *gain, int64_t n, float eps, float *y)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv * gain[i];
}

/* rotate_half rope on one head: x·cos + (−x₂, x₁)·sin */
static void rope(float *x, const float *cos_, const float *sin_, int64_t d)
{
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cos_[i] - b * sin_[i];
        x[i + half] = b * cos_[i + half] + a * sin_[i + half];
    }
}

/* HF's gelu_pytorch_tanh, 0.5·x·(1 + tanh(y)) with y = sqrt(2/π)·(x + 0.044715·x³), written as the same value
 * x / (1 + e^(−2y)): no tanh call, and no cancellation in 1 + tanh(y) for negative x (where torch's own form
 * loses digits: at x = −5 it gives −2.98e-7 against −2.29e-7).  Within 5e-7 of that form elsewhere. */
static inline float gelu_tanh(float x)
{
    const float c = 0.7978845608028654f; /* sqrt(2/π) */
    return x / (1.0f + exp_vec(-2.0f * c * (x + 0.044715f * x * x * x)));
}

/* a product on a packed weight (AMX's tiles or AVX-512 VNNI): w8a16_kernel.c's w8a16_packed_matmul, whose
 * address the caller passes (it is built apart, with the int16 kernels) */
typedef int (*packed_fn)(const float *, int64_t, int64_t, const int8_t *, const float *, const float *, int64_t,
                        int64_t, float *, int);

/* A weight's group below zero marks it packed (its pointers are the packed codes, scales and
 * offsets): its product takes integer sums on int16 activations, every row count alike. */
static int product(const void *const *w, const int64_t *dim, int which, const float *x, int64_t rows, float *y,
                   int threads, packed_fn packed)
{
    const void *const *p = w + 3 * which;
    const int64_t *d = dim + 3 * which; /* group, out, in */
    if (d[0] < 0)
        return packed ? packed(x, rows, d[2], (const int8_t *)p[0], (const float *)p[1], (const float *)p[2], -d[0],
                               d[1], y, threads)
                     : -1;
    return int8_matmul(x, rows, d[2], (const int8_t *)p[0], (const float *)p[1], (const float *)p[2], d[0], d[1],
                       y, threads);
}

/* Scratch floats the caller provides for `rows` rows. */
int64_t block_scratch(int64_t rows, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      int64_t inter, int64_t cap)
{
    return rows * (2 * hidden + 2 * heads * head_dim + 2 * kv_heads * head_dim + 2 * inter + heads * cap);
}

/* Row loops share the threads where the rows are many (a pass's hundreds); a decode step's few stay on one. */
#define ROWS_IN_PARALLEL(n) if ((n) >= 8)

/* Returns 0, or -1 when a product refuses its shape (the caller checks every weight before the first step).
 * cols[r]: row r's column; stores[r]: its store row (NULL: r); start[]: per store row; ff_rows[0 .. n_ff):
 * the rows the MLP runs on, ascending (NULL: every row, n_ff ignored). */
int block_step(int64_t rows, int64_t hidden, float *h, const float *const *gains, float eps,
               const void *const *w, const int64_t *dim, int64_t heads, int64_t kv_heads, int64_t head_dim,
               const float *cos_, const float *sin_, float *kstore, float *vstore, int64_t cap, const int64_t *cols,
               const int64_t *stores, const int64_t *start, int64_t window, float scaling, float softcap,
               const float *head_add, const int64_t *ff_rows, int64_t n_ff, float *scratch, int threads,
               packed_fn packed)
{
    const int64_t qd = heads * head_dim, kd = kv_heads * head_dim, inter = dim[3 * W_GATE + 1];
    float *x = scratch, *o = x + rows * hidden, *q = o + rows * hidden, *a = q + rows * qd;
    float *k = a + rows * qd, *v = k + rows * kd, *gate = v + rows * kd, *up = gate + rows * inter;
    float *scores = up + rows * inter;
    if (!ff_rows) n_ff = rows;
    int64_t widest = 0;
    for (int64_t r = 0; r < rows; r++)
        if (cols[r] + 1 > widest) widest = cols[r] + 1;
#pragma omp parallel for num_threads(threads) schedule(static) ROWS_IN_PARALLEL(rows)
    for (int64_t r = 0; r < rows; r++) rms(h + r * hidden, gains[G_IN], hidden, eps, x + r * hidden);
    if (product(w, dim, W_Q, x, rows, q, threads, packed) || product(w, dim, W_K, x, rows, k, threads, packed)
        || product(w, dim, W_V, x, rows, v, threads, packed))
        return -1;
#pragma omp parallel for num_threads(threads) schedule(static) ROWS_IN_PARALLEL(rows)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_ + r * head_dim, *s = sin_ + r * head_dim;
        const int64_t sr = stores ? stores[r] : r;
        for (int64_t i = 0; i < heads; i++) {
            float *qi = q + r * qd + i * head_dim;
            rms(qi, gains[G_Q], head_dim, eps, qi);
            rope(qi, c, s, head_dim);
        }
        for (int64_t j = 0; j < kv_heads; j++) {
            float *kj = k + r * kd + j * head_dim;
            rms(kj, gains[G_K], head_dim, eps, kj);
            rope(kj, c, s, head_dim);
            const int64_t at = ((sr * kv_heads + j) * cap + cols[r]) * head_dim;
            memcpy(kstore + at, kj, head_dim * sizeof(float));
            memcpy(vstore + at, v + r * kd + j * head_dim, head_dim * sizeof(float));
        }
    }
    const int64_t group = heads / kv_heads, pairs = rows * heads;
    /* attention: one (row, head) per iteration, each alone */
#pragma omp parallel for num_threads(threads) schedule(static) if (pairs * widest * head_dim > 65536)
    for (int64_t p = 0; p < pairs; p++) {
        const int64_t r = p / heads, i = p % heads, j = i / group, col = cols[r], sr = stores ? stores[r] : r;
        int64_t lo = start[sr];
        if (window > 0 && col - window + 1 > lo) lo = col - window + 1;
        const float *qi = q + r * qd + i * head_dim;
        const float *kj = kstore + (sr * kv_heads + j) * cap * head_dim;
        const float *vj = vstore + (sr * kv_heads + j) * cap * head_dim;
        float *sc = scores + p * cap, *out = a + r * qd + i * head_dim;
        float top = -INFINITY;
        for (int64_t c = lo; c <= col; c++) {
            const float *kc = kj + c * head_dim;
            float dot = 0.0f;
            /* in vector lanes, then the lanes summed: a sum taken in order is one add per 4 cycles (its
             * latency), ~1 ms of a one-row step over 18 blocks; the order is fixed per build, the same for
             * every row */
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < head_dim; d++) dot += qi[d] * kc[d];
            dot *= scaling;
            if (softcap > 0.0f) dot = tanhf(dot / softcap) * softcap;
            sc[c] = dot;
            if (dot > top) top = dot;
        }
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t c = lo; c <= col; c++) {
            sc[c] = exp_vec(sc[c] - top);
            total += sc[c];
        }
        for (int64_t d = 0; d < head_dim; d++) out[d] = 0.0f;
        for (int64_t c = lo; c <= col; c++) {
            const float pc = sc[c] / total, *vc = vj + c * head_dim;
            for (int64_t d = 0; d < head_dim; d++) out[d] += pc * vc[d];
        }
    }
    if (head_add)
        for (int64_t n = 0; n < rows * qd; n++) a[n] += head_add[n];
    if (product(w, dim, W_O, a, rows, o, threads, packed)) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) ROWS_IN_PARALLEL(rows)
    for (int64_t r = 0; r < rows; r++) {
        float *hr = h + r * hidden, *orow = o + r * hidden;
        rms(orow, gains[G_POST_ATTN], hidden, eps, orow);
        for (int64_t n = 0; n < hidden; n++) hr[n] += orow[n];
    }
    /* the MLP's rows gathered in front: x's i-th row is row ff_rows[i]'s */
#pragma omp parallel for num_threads(threads) schedule(static) ROWS_IN_PARALLEL(n_ff)
    for (int64_t i = 0; i < n_ff; i++)
        rms(h + (ff_rows ? ff_rows[i] : i) * hidden, gains[G_PRE_FF], hidden, eps, x + i * hidden);
    if (product(w, dim, W_GATE, x, n_ff, gate, threads, packed) || product(w, dim, W_UP, x, n_ff, up, threads, packed))
        return -1;
#pragma omp parallel for simd num_threads(threads) schedule(static) ROWS_IN_PARALLEL(n_ff)
    for (int64_t n = 0; n < n_ff * inter; n++) gate[n] = gelu_tanh(gate[n]) * up[n];
    if (product(w, dim, W_DOWN, gate, n_ff, o, threads, packed)) return -1;
#pragma omp parallel for num_threads(threads) schedule(static) ROWS_IN_PARALLEL(n_ff)
    for (int64_t i = 0; i < n_ff; i++) {
        float *hr = h + (ff_rows ? ff_rows[i] : i) * hidden, *orow = o + i * hidden;
        rms(orow, gains[G_POST_FF], hidden, eps, orow);
        for (int64_t n = 0; n < hidden; n++) hr[n] += orow[n];
    }
    return 0;
}
