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

/* One slice of a row against the base row b (its probabilities pb, in double): what vocab_compare merges. */
typedef struct {
    float top, gap;  /* the slice's maximum, its largest |x - b| */
    int64_t at;      /* the first index of the maximum */
    double sum, mom; /* sum of e^(x - top), and of e^(x - top) (x - top) */
    double kl;       /* sum of pb (b - x) */
    int odd;
} versus_t;

static void versus(const float *x, const float *b, const double *pb, int64_t lo, int64_t hi, versus_t *s)
{
    float top = -INFINITY, gap = 0.0f;
    int odd = 0;
    double kl = 0.0;
#pragma omp simd reduction(max : top, gap) reduction(| : odd) reduction(+ : kl)
    for (int64_t j = lo; j < hi; j++) {
        top = x[j] > top ? x[j] : top;
        const float d = fabsf(x[j] - b[j]);
        gap = d > gap ? d : gap;
        odd |= !isfinite(x[j]);
        kl += pb[j] * ((double)b[j] - (double)x[j]);
    }
    s->top = top;
    s->gap = gap;
    s->odd = odd;
    s->kl = kl;
    s->sum = s->mom = 0.0;
    s->at = lo;
    if (odd) return;
    for (int64_t j = lo; j < hi; j++)
        if (x[j] == top) {
            s->at = j;
            break;
        }
    for (int64_t c = lo; c < hi; c += RUN) {
        const int64_t e = c + RUN < hi ? c + RUN : hi;
        float part = 0.0f, moment = 0.0f;
#pragma omp simd reduction(+ : part, moment)
        for (int64_t j = c; j < e; j++) {
            const float d = x[j] - top, w = exp_neg(d);
            part += w;
            moment += w * d;
        }
        s->sum += part;
        s->mom += moment;
    }
}

/* Each row of x (rows, n) against the base row b (n) and its probabilities pb = softmax(b) in double (issue #50:
 * the dose-response frame took five torch passes over every row, ~20 ms of a 21-row sweep).  Per row, into
 * out[r * 5 ..]: the maximum, the log-sum-exp, the entropy of softmax(x), KL(softmax(b) || softmax(x)) less the
 * base's own log-sum-exp term (the caller adds lse(x) - lse(b) from this same function's numbers for b), and
 * max |x - b|; argmax[r]: the first index of the maximum.  Slices fixed per row, merged in order: a row's numbers
 * do not depend on the rows beside it or on the threads.  Returns 0, 1 when a row holds NaN or an infinity (the
 * caller keeps torch's meaning), -1 for a shape it does not take or memory. */
int vocab_compare(const float *x, int64_t rows, int64_t n, const float *b, const double *pb, int64_t *argmax,
                  double *out, int threads)
{
    if (rows < 0 || n < CHUNKS) return -1;
    const int64_t slices = rows * CHUNKS;
    versus_t *s = (versus_t *)malloc((size_t)(slices > 0 ? slices : 1) * sizeof(versus_t));
    if (!s) return -1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t c = 0; c < slices; c++) {
        const int64_t r = c / CHUNKS, q = c % CHUNKS, lo = n * q / CHUNKS, hi = n * (q + 1) / CHUNKS;
        versus(x + r * n, b, pb, lo, hi, &s[c]);
    }
    for (int64_t r = 0; r < rows; r++) {
        const versus_t *p = s + r * CHUNKS;
        float top = -INFINITY, gap = 0.0f;
        int64_t at = 0;
        for (int q = 0; q < CHUNKS; q++) {
            if (p[q].odd) { /* what the caller was given so far is void: it keeps torch's passes */
                free(s);
                return 1;
            }
            if (p[q].top > top) { /* strictly: on a tie the earlier slice's index stays, the first maximum */
                top = p[q].top;
                at = p[q].at;
            }
            gap = p[q].gap > gap ? p[q].gap : gap;
        }
        double total = 0.0, moment = 0.0, kl = 0.0;
        for (int q = 0; q < CHUNKS; q++) {
            const double shift = (double)p[q].top - (double)top, w = exp(shift);
            total += p[q].sum * w;
            moment += (p[q].mom + p[q].sum * shift) * w;
            kl += p[q].kl;
        }
        const double lse = (double)top + log(total), mean = moment / total; /* mean of x - top under softmax(x) */
        double *o = out + r * 5;
        o[0] = top;
        o[1] = lse;
        o[2] = log(total) - mean; /* lse - E[x] = -sum p log p */
        o[3] = kl;
        o[4] = gap;
        argmax[r] = at;
    }
    free(s);
    return 0;
}
