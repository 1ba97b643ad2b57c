/* e^x in float lanes, shared by the block kernel and the logits pass (vocab_kernel.c). */
#ifndef STEER_UI_EXP_VEC_H
#define STEER_UI_EXP_VEC_H
#include <stdint.h>
#include <string.h>

/* e^x for the GELU and the attention's softmax (block_kernel.c) and the logits pass (vocab_kernel.c), written so
 * that the compiler vectorises its loop (libm's expf and tanhf are scalar calls: 36,864 tanhf a one-row step,
 * 0.38-0.48 ms, 11 ms at 24 rows). Cephes' expf: x = k·ln 2 + r with |r| <= ln 2 / 2 (ln 2 in two parts), a
 * degree-7 polynomial for e^r, 2^k from the exponent bits; about one unit in the last place. k is rounded by
 * adding and subtracting 1.5·2^23 (floorf does not vectorise without -fno-trapping-math). The argument is
 * clamped to [-87, 88], where 2^k stays a normal float. */
static inline float exp_vec(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693359375f;
    r = r + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)k + 127) << 23;
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

#endif
