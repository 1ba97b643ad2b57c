/* How many AVX-512 VNNI integer products (vpdpbusd on 64-byte vectors) this CPU retires a second, per thread and
 * on several threads: the ceiling of the packed int16 product (w8a16_kernel.c), which takes two of them (the
 * activations' high and low bytes) per 64 multiply-adds.  Twelve independent accumulators in registers and no
 * memory traffic: the instruction's throughput alone.  Written in assembly, since a compiler sees that the same
 * two operands meet each accumulator and folds the products into one. */
#include <omp.h>
#include <time.h>

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* vpdpbusd instructions a second on `threads` threads, each running `loops` rounds of 12; -1 where this build
 * has no AVX-512 VNNI */
double vnni_products_per_second(int threads, long loops) {
#if defined(__AVX512VNNI__) && defined(__x86_64__)
    double start = seconds();
    int ran = 1;  /* the threads OpenMP started (fewer than asked where it may not give them all) */
#pragma omp parallel num_threads(threads)
    {
#pragma omp single
        ran = omp_get_num_threads();
        for (long i = 0; i < loops; i++) {
            __asm__ volatile(
                "vpdpbusd %%zmm12, %%zmm13, %%zmm0\n\t" "vpdpbusd %%zmm12, %%zmm13, %%zmm1\n\t"
                "vpdpbusd %%zmm12, %%zmm13, %%zmm2\n\t" "vpdpbusd %%zmm12, %%zmm13, %%zmm3\n\t"
                "vpdpbusd %%zmm12, %%zmm13, %%zmm4\n\t" "vpdpbusd %%zmm12, %%zmm13, %%zmm5\n\t"
                "vpdpbusd %%zmm12, %%zmm13, %%zmm6\n\t" "vpdpbusd %%zmm12, %%zmm13, %%zmm7\n\t"
                "vpdpbusd %%zmm12, %%zmm13, %%zmm8\n\t" "vpdpbusd %%zmm12, %%zmm13, %%zmm9\n\t"
                "vpdpbusd %%zmm12, %%zmm13, %%zmm10\n\t" "vpdpbusd %%zmm12, %%zmm13, %%zmm11\n\t"
                ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                    "xmm11");
        }
    }
    return 12.0 * (double)loops * ran / (seconds() - start);
#else
    (void)threads;
    (void)loops;
    return -1.0;
#endif
}
