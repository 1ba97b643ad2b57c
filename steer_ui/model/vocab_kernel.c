/* One pass over each row of a decode step's logits: its log-sum-exp and its k largest values with their indices
 * (issue #50).  torch took one pass for the log-sum-exp, another for a blocked top-k and a third for a blocked
 * argmax: ~0.4 ms a row of 262,144 logits on these CPUs, ~7 ms for the 16 sampled rows of a many-users step.
 *
 * Each row is cut into CHUNKS fixed slices whatever the thread count, each slice reduced alone (its maximum, its
 * sum of e^(x - maximum) in double, its k largest), then the slices merged in order: a row's numbers do not depend
 * on the rows beside it or on the threads.  Ties keep the lower index first, so the first of the k is the row's
 * argmax as torch defines it (the first maximal index).  A row holding NaN or an infinity is reported, not
 * summarised: the caller keeps torch's meaning for those.
 * Built like int8_kernel.c (-O3 -march=native -fopenmp -ffp-contract=off) and called through ctypes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "exp_vec.h"

#define CHUNKS 8
#define MAX_K 64
#define RUN 1024 /* values whose exponentials are summed in float before the sum moves to double */

/* e^x for x <= 0; 0 below -87, where exp_vec clamps (e^x leaves the normal floats there) */
static inline float exp_neg(float x)
{
    const float e = exp_vec(x);
    return x < -87.0f ? 0.0f : e;
}

typedef struct {
    float top;
    double sum;
    int odd; /* NaN or an infinity seen */
    int n;
    float v[MAX_K];
    int64_t i[MAX_K];
} slice_t;

static void reduce(const float *x, int64_t lo, int64_t hi, int k, slice_t *s)
{
    float top = -INFINITY;
    int odd = 0;
#pragma omp simd reduction(max : top) reduction(| : odd)
    for (int64_t j = lo; j < hi; j++) {
        top = x[j] > top ? x[j] : top;
        odd |= !isfinite(x[j]);
    }
    s->top = top;
    s->odd = odd;
    s->n = 0;
    s->sum = 0.0;
    if (odd) return;
    for (int64_t b = lo; b < hi; b += RUN) {
        const int64_t e = b + RUN < hi ? b + RUN : hi;
        float part = 0.0f;
#pragma omp simd reduction(+ : part)
        for (int64_t j = b; j < e; j++) part += exp_neg(x[j] - top);
        s->sum += part;
    }
    /* the k largest, kept sorted (a later equal value goes after the earlier ones); a run of 16 values none of
     * which beats the k-th is skipped in one vector compare */
    float floor_ = -INFINITY;
    for (int64_t b = lo; b < hi; b += 16) {
        const int64_t e = b + 16 < hi ? b + 16 : hi;
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int64_t j = b; j < e; j++) any |= x[j] > floor_;
        if (!any && s->n == k) continue;
        for (int64_t j = b; j < e; j++) {
            const float v = x[j];
            if (s->n == k && !(v > s->v[k - 1])) continue;
            int at = s->n < k ? s->n : k - 1;
            while (at > 0 && v > s->v[at - 1]) {
                s->v[at] = s->v[at - 1];
                s->i[at] = s->i[at - 1];
                at--;
            }
            if (s->n < k) s->n++;
            s->v[at] = v;
            s->i[at] = j;
            if (s->n == k) floor_ = s->v[k - 1];
        }
    }
}

/* Returns 0; 1 when some row holds NaN or an infinity (nothing is summarised then); -1 for k outside 1..MAX_K or
 * fewer than k values a row. */
int vocab_top(const float *x, int64_t rows, int64_t n, int k, float *top_v, int64_t *top_i, float *lse, int threads)
{
    if (k < 1 || k > MAX_K || n < k || n < CHUNKS) return -1;
    const int64_t slices = rows * CHUNKS;
    slice_t *s = (slice_t *)malloc((size_t)(slices > 0 ? slices : 1) * sizeof(slice_t));
    if (!s) return -1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < slices; c++) {
        const int64_t r = c / CHUNKS, q = c % CHUNKS;
        reduce(x + r * n, n * q / CHUNKS, n * (q + 1) / CHUNKS, k, &s[c]);
    }
    int odd = 0;
    for (int64_t c = 0; c < slices; c++) odd |= s[c].odd;
    if (odd) {
        free(s);
        return 1;
    }
    for (int64_t r = 0; r < rows; r++) {
        const slice_t *p = s + r * CHUNKS;
        float top = -INFINITY;
        for (int q = 0; q < CHUNKS; q++) top = p[q].top > top ? p[q].top : top;
        double total = 0.0;
        for (int q = 0; q < CHUNKS; q++) total += p[q].sum * exp((double)p[q].top - (double)top);
        lse[r] = (float)((double)top + log(total));
        int taken[CHUNKS] = {0};
        for (int a = 0; a < k; a++) { /* the slices' lists merged; on equal values the earlier slice first */
            int best = -1;
            for (int q = 0; q < CHUNKS; q++)
                if (taken[q] < p[q].n && (best < 0 || p[q].v[taken[q]] > p[best].v[taken[best]])) best = q;
            top_v[r * k + a] = p[best].v[taken[best]];
            top_i[r * k + a] = p[best].i[taken[best]];
            taken[best]++;
        }
    }
    free(s);
    return 0;
}
