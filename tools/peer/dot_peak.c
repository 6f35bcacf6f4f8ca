// The arithmetic peaks behind the prefill roofline of tools/peer (docs/PERFORMANCE.md, "sluice and
// llama.cpp"): how many multiply-adds per second one core retires with each instruction that a
// matrix product of the two engines can be built from.
//
//   f32 FMA    vfmadd231ps          sluice: weights widened to f32, activations f32 (exact)
//   bf16 dot   vdpbf16ps            llama.cpp, bf16 weights: activations rounded to bf16
//   int8 dot   vpdpbusd (VNNI)      llama.cpp, MXFP4 / Q8 weights: activations quantized to 8 bits
//   int8 AVX2  vpmaddubsw+vpmaddwd  the same without VNNI (ggml's AVX2 path)
//
// Each kernel is a register-only loop of independent accumulator chains (no loads), so it measures
// the execution ports, not memory. Rates are in GOP/s with a multiply-add counted as 2 operations
// (so f32 FMA GOP/s = GFLOP/s, the unit of `sluice probe --kernels`). Two figures per kernel:
// "oncpu": operations per on-CPU second of one thread (CLOCK_THREAD_CPUTIME_ID: the core's rate,
// which a shared machine's other processes do not depress), and "wall": all THREADS threads'
// operations per wall second. Each is the median of REPS repetitions.
//
//   cc -O2 -o dot_peak tools/peer/dot_peak.c -lpthread      (no -march needed: per-function targets)
//   dot_peak [THREADS=2] [REPS=5] [MILLIONS_OF_ITERATIONS=200]
//
// prints one JSON line: {"threads":T,"kernels":{"f32_fma_zmm":{"oncpu_gops":..,"wall_gops":..},..}}
// Kernels the CPU lacks (checked with __builtin_cpu_supports) are left out.
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHAINS 12 // independent accumulators: covers a 4–5 cycle latency on 2 pipes

static volatile float sink_f;
static volatile int sink_i;

static double seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

// Each kernel runs `iters` steps of CHAINS instructions and returns the operations it did. The
// chains are named variables (not an array: GCC at -O2 keeps an array of vectors in memory).
typedef double (*kernel_fn)(long iters);

#define EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
// INIT_(c) a chain's start, OP_(x) one instruction on a chain, ADD_(x, y) the fold: defined
// before each KERNEL and expanded there.
#define DECL(c) acc##c = INIT_(c),
#define STEP(c) acc##c = OP_(acc##c);
#define FOLD(c) sum = ADD_(sum, acc##c);
// One kernel: V the vector type, zero the fold's start, store(x) keeps the result live, `per`
// multiply-adds per instruction.
#define KERNEL(name, targets, V, zero, store, per)                                      \
    __attribute__((target(targets))) static double name(long iters) {                 \
        V EACH(DECL) sum = zero;                                                        \
        for (long i = 0; i < iters; i++) {                                              \
            EACH(STEP)                                                                  \
            /* opaque to the optimizer: no step is folded or hoisted */                 \
            __asm__ volatile("" : "+v"(acc0), "+v"(acc1), "+v"(acc2), "+v"(acc3),        \
                             "+v"(acc4), "+v"(acc5), "+v"(acc6), "+v"(acc7));            \
            __asm__ volatile("" : "+v"(acc8), "+v"(acc9), "+v"(acc10), "+v"(acc11));     \
        }                                                                               \
        EACH(FOLD)                                                                      \
        store(sum);                                                                     \
        return (double) iters * CHAINS * (per) * 2;                                     \
    }

static void store_ps512(__m512 x) __attribute__((target("avx512f")));
static void store_ps512(__m512 x) { sink_f = _mm512_reduce_add_ps(x); }
static void store_si512(__m512i x) __attribute__((target("avx512f")));
static void store_si512(__m512i x) { sink_i = _mm512_reduce_add_epi32(x); }
static void store_ps256(__m256 x) __attribute__((target("avx")));
static void store_ps256(__m256 x) {
    float out[8];
    _mm256_storeu_ps(out, x);
    sink_f = out[0];
}
static void store_si256(__m256i x) __attribute__((target("avx")));
static void store_si256(__m256i x) {
    int out[8];
    _mm256_storeu_si256((__m256i *) out, x);
    sink_i = out[0];
}

// f32 FMA, zmm: acc = a·acc + b (16 multiply-adds per instruction)
#define INIT_(c) _mm512_set1_ps((float) (c) + sink_f)
#define OP_(x) _mm512_fmadd_ps(_mm512_set1_ps(1.0f), x, _mm512_set1_ps(0.999f))
#define ADD_ _mm512_add_ps
KERNEL(f32_fma_zmm, "avx512f", __m512, _mm512_setzero_ps(), store_ps512, 16)
#undef OP_
// bf16 dot, zmm: acc += a[2i]·b[2i] + a[2i+1]·b[2i+1] in 16 lanes (32 multiply-adds)
#define OP_(x) _mm512_dpbf16_ps(x, (__m512bh) _mm512_set1_epi32(0x3f803f80), \
                                (__m512bh) _mm512_set1_epi32(0x3f7f3f7f))
KERNEL(bf16_dot_zmm, "avx512f,avx512bf16", __m512, _mm512_setzero_ps(), store_ps512, 32)
#undef INIT_
#undef OP_
#undef ADD_

// f32 FMA, ymm (8 multiply-adds; what AVX2 machines have)
#define INIT_(c) _mm256_set1_ps((float) (c) + sink_f)
#define OP_(x) _mm256_fmadd_ps(_mm256_set1_ps(1.0f), x, _mm256_set1_ps(0.999f))
#define ADD_ _mm256_add_ps
KERNEL(f32_fma_ymm, "avx2,fma", __m256, _mm256_setzero_ps(), store_ps256, 8)
#undef INIT_
#undef OP_
#undef ADD_

// int8 VNNI, zmm: acc += Σ of 4 u8·s8 products in 16 lanes (64 multiply-adds)
#define INIT_(c) _mm512_set1_epi32((c) + sink_i)
#define OP_(x) _mm512_dpbusd_epi32(x, _mm512_set1_epi8(3), _mm512_set1_epi8(-2))
#define ADD_ _mm512_add_epi32
KERNEL(int8_vnni_zmm, "avx512f,avx512vnni", __m512i, _mm512_setzero_si512(), store_si512, 64)
#undef INIT_
#undef OP_
#undef ADD_

// int8 VNNI, ymm (32 multiply-adds)
#define INIT_(c) _mm256_set1_epi32((c) + sink_i)
#define OP_(x) _mm256_dpbusd_epi32(x, _mm256_set1_epi8(3), _mm256_set1_epi8(-2))
#define ADD_ _mm256_add_epi32
KERNEL(int8_vnni_ymm, "avx512f,avx512vl,avx512vnni", __m256i, _mm256_setzero_si256(), store_si256,
       32)
#undef OP_
// int8 without VNNI (ggml's AVX2 path): vpmaddubsw (u8×s8 pairs to s16), vpmaddwd by ones (to
// s32), vpaddd into the chain: three instructions per 32 multiply-adds. The chain is also the u8
// operand, so no product can be hoisted out of the loop.
#define OP_(x) _mm256_add_epi32(x, _mm256_madd_epi16(_mm256_maddubs_epi16(x, _mm256_set1_epi8(-2)), \
                                                     _mm256_set1_epi16(1)))
KERNEL(int8_maddubs_ymm, "avx2", __m256i, _mm256_setzero_si256(), store_si256, 32)
#undef INIT_
#undef OP_
#undef ADD_

struct job {
    kernel_fn fn;
    long iters;
    double ops, cpu_s;
};

static void * run_job(void * p) {
    struct job * j = p;
    double c0 = seconds(CLOCK_THREAD_CPUTIME_ID);
    j->ops = j->fn(j->iters);
    j->cpu_s = seconds(CLOCK_THREAD_CPUTIME_ID) - c0;
    return NULL;
}

static int cmp_double(const void * a, const void * b) {
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

static double median(double * v, int n) {
    qsort(v, (size_t) n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char ** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    long iters = (argc > 3 ? atol(argv[3]) : 200) * 1000000L / CHAINS;
    if (threads < 1 || threads > 256 || reps < 1 || reps > 100 || iters < 1) {
        fprintf(stderr, "usage: %s [THREADS 1..256] [REPS 1..100] [MILLIONS_OF_ITERATIONS]\n", argv[0]);
        return 2;
    }
    __builtin_cpu_init();
    struct {
        const char * name;
        kernel_fn fn;
        int ok;
    } ks[] = {
        {"f32_fma_zmm", f32_fma_zmm, __builtin_cpu_supports("avx512f")},
        {"f32_fma_ymm", f32_fma_ymm, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
        {"bf16_dot_zmm", bf16_dot_zmm, __builtin_cpu_supports("avx512bf16")},
        {"int8_vnni_zmm", int8_vnni_zmm, __builtin_cpu_supports("avx512vnni")},
        {"int8_vnni_ymm", int8_vnni_ymm,
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl")},
        {"int8_maddubs_ymm", int8_maddubs_ymm, __builtin_cpu_supports("avx2")},
    };
    printf("{\"threads\":%d,\"reps\":%d,\"kernels\":{", threads, reps);
    int first = 1;
    pthread_t * tid = calloc((size_t) threads, sizeof *tid);
    struct job * jobs = calloc((size_t) threads, sizeof *jobs);
    double * oncpu = calloc((size_t) reps, sizeof(double));
    double * wall = calloc((size_t) reps, sizeof(double));
    if (!tid || !jobs || !oncpu || !wall) {
        fprintf(stderr, "dot_peak: out of memory\n");
        return 1;
    }
    for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
        if (!ks[k].ok) {
            continue;
        }
        for (int r = 0; r < reps; r++) {
            double w0 = seconds(CLOCK_MONOTONIC), ops = 0, rate = 0;
            for (int t = 0; t < threads; t++) {
                jobs[t] = (struct job) {ks[k].fn, iters, 0, 0};
                if (pthread_create(&tid[t], NULL, run_job, &jobs[t]) != 0) {
                    fprintf(stderr, "dot_peak: cannot start thread %d\n", t);
                    return 1;
                }
            }
            for (int t = 0; t < threads; t++) {
                pthread_join(tid[t], NULL);
                ops += jobs[t].ops;
                rate += jobs[t].ops / jobs[t].cpu_s;
            }
            wall[r] = ops / (seconds(CLOCK_MONOTONIC) - w0) / 1e9;
            oncpu[r] = rate / threads / 1e9;
        }
        printf("%s\"%s\":{\"oncpu_gops\":%.2f,\"wall_gops\":%.2f}", first ? "" : ",", ks[k].name,
               median(oncpu, reps), median(wall, reps));
        first = 0;
    }
    printf("}}\n");
    return 0;
}
