/* A sampled request's uniforms, drawn exactly as torch.rand(n, dtype=float64, generator=g) draws them on the CPU
 * (mt_stream.py says why and how the generator's state comes and goes).
 *
 * PyTorch's CPU generator is the standard MT19937 (at::mt19937: init_genrand seeding, the usual twist and
 * tempering).  A float64 uniform takes two 32-bit outputs, the first as the high half of a 64-bit word, keeps its
 * low 53 bits and scales them by 2^-53 (at::uniform_real_distribution<double> on random64()).  torch draws them one
 * call at a time behind the generator's lock, ~4 ns a uniform here; this file regenerates the 624-word state a
 * block at a time in loops the compiler vectorises, tempers a block at once, and pairs the words: the same integers,
 * so the same doubles, bit for bit (tests/unit/test_mt_stream.py compares them with torch's own).
 */
#include <stdint.h>
#include <string.h>

#define N 624
#define M 397

static inline uint32_t twist(uint32_t u, uint32_t v) {
    return ((((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1)) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

/* The next 624-word state from s, in place: the same recurrence as at::mt19937::next_state. Written with the old
 * words read before any write of the loop that needs them, so each loop vectorises. */
static void regenerate(uint32_t *s) {
    uint32_t old[N];
    memcpy(old, s, sizeof old);
    for (int i = 0; i < N - M; i++)
        s[i] = old[i + M] ^ twist(old[i], old[i + 1]);
    for (int i = N - M; i < N - 1; i++)
        s[i] = s[i + M - N] ^ twist(old[i], old[i + 1]);
    s[N - 1] = s[M - 1] ^ twist(old[N - 1], s[0]);
}

static inline uint32_t temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* n float64 uniforms into out, from the state (624 words), left and next as at::mt19937 keeps them (a word is
 * taken by: if (--left == 0) regenerate, left = 624, next = 0; y = state[next++]).  A uniform of 0 becomes
 * `floor` (the sampler's clamp: the Gumbel transform of 0 is -inf).  Returns 0, or -1 for a state no generator
 * could be in. */
int mt_uniforms(uint32_t *state, int32_t *left_next, double *out, int64_t n, double floor) {
    int64_t left = left_next[0], next = left_next[1];
    if (left < 1 || left > N + 1 || next < 0 || next > N || n < 0)
        return -1;
    uint32_t words[2 * N];
    int64_t done = 0;
    int has_pending = 0;
    uint32_t pending = 0;  /* the high half of a uniform whose low half comes after a regeneration */
    const double scale = 1.0 / 9007199254740992.0;  /* 2^-53 */
    while (done < n) {
        if (left == 1) {  /* the next word needs a new state */
            regenerate(state);
            left = N + 1;
            next = 0;
        }
        int64_t avail = left - 1;  /* words this state still gives */
        int64_t want = 2 * (n - done) - has_pending;
        int64_t take = avail < want ? avail : want;
        for (int64_t i = 0; i < take; i++)
            words[i] = temper(state[next + i]);
        next += take;
        left -= take;
        int64_t i = 0;
        if (has_pending && take > 0) {
            uint64_t v = ((uint64_t)pending << 32) | words[0];
            double u = (double)(v & ((1ull << 53) - 1)) * scale;
            out[done++] = u > 0.0 ? u : floor;
            has_pending = 0;
            i = 1;
        }
        int64_t pairs = (take - i) / 2;
        const uint32_t *w = words + i;
        double *o = out + done;
        for (int64_t j = 0; j < pairs; j++) {
            /* 53 bits: exact in an int64 and in a double */
            int64_t v = (int64_t)((((uint64_t)w[2 * j] << 32) | w[2 * j + 1]) & ((1ull << 53) - 1));
            double u = (double)v * scale;
            o[j] = u > 0.0 ? u : floor;
        }
        done += pairs;
        i += 2 * pairs;
        if (i < take) {
            pending = words[i];
            has_pending = 1;
        }
    }
    left_next[0] = (int32_t)left;
    left_next[1] = (int32_t)next;
    return 0;
}
