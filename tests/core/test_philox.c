/* towerpack tests: Philox4x32-10 and the noise it draws
 * (towerpack/philox.h), the GAN trainers' z on the host and, through the
 * same header, in the CUDA kernel (gpu/cuda/noise.cu; its bit-for-bit
 * comparison with the host is cuda_ops/noise_fill_is_the_hosts in
 * tests/gpu/test_cuda_ops.c, run on a GPU).
 *
 * Here: Random123's known answers for the generator, the distributions,
 * the noise as a pure function of (seed, step, row, element), the ln the
 * normal draw computes from + - * / alone against libm, and
 * tp_gan_noise_fill drawing exactly the shared function's numbers. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <towerpack/gan.h>
#include <towerpack/philox.h>

/* Random123 1.14, examples/kat_vectors: philox4x32 with 10 rounds. */
Test(philox, random123_known_answers) {
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof *kat; i++) {
        tp_philox4_t c;
        memcpy(c.v, kat[i].ctr, sizeof c.v);
        tp_philox4_t o = tp_philox4x32_10(c, kat[i].key[0], kat[i].key[1]);
        for (int w = 0; w < 4; w++)
            cr_assert_eq(o.v[w], kat[i].out[w], "vector %zu word %d: %08x, want %08x", i,
                         w, o.v[w], kat[i].out[w]);
    }
}

/* The ln the polar method uses, against libm over (2^-40, 1]. */
Test(philox, ln_from_basic_operations_is_libms_to_1e_15) {
    double worst = 0;
    for (int i = 1; i <= 100000; i++) {
        double s = ldexp((double)i / 100000.0, -(i % 41));
        double got = tp_philox_ln_(s), want = log(s);
        double err = fabs(got - want) / fmax(fabs(want), 1e-300);
        if (s != 1.0 && err > worst)
            worst = err;
    }
    cr_assert(tp_philox_ln_(1.0) == 0.0);
    cr_assert_lt(worst, 1e-15, "ln's worst relative error %g", worst);
}

static void s_moments(const float *x, size_t n, double *mean, double *var, double *m4) {
    double s = 0, s2 = 0, s4 = 0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    *mean = s / (double)n;
    for (size_t i = 0; i < n; i++) {
        double d = x[i] - *mean;
        s2 += d * d;
        s4 += d * d * d * d;
    }
    *var = s2 / (double)n;
    *m4 = s4 / (double)n;
}

enum { ROWS = 256, DIM = 100, N = ROWS * DIM };

Test(philox, uniform_noise_fills_its_range_evenly) {
    static float z[N];
    tp_philox_noise_fill(7, 3, 0, ROWS, DIM, 0, 2.0f, z);
    double mean, var, m4;
    s_moments(z, N, &mean, &var, &m4);
    int bins[8] = {0};
    for (int i = 0; i < N; i++) {
        cr_assert(z[i] >= -2.0f && z[i] < 2.0f, "z[%d] = %g outside [-2, 2)", i, z[i]);
        bins[(int)((z[i] + 2.0f) * 2.0f)]++;
    }
    /* U(-2, 2): mean 0, variance 4/3; sd of the mean 0.0072 */
    cr_assert_lt(fabs(mean), 0.03, "mean %g", mean);
    cr_assert_lt(fabs(var - 4.0 / 3.0), 0.03, "variance %g", var);
    for (int b = 0; b < 8; b++)  /* N / 8 = 3200, sd 53 */
        cr_assert(bins[b] > 3000 && bins[b] < 3400, "bin %d holds %d", b, bins[b]);
}

Test(philox, normal_noise_has_the_normals_moments_and_tails) {
    static float z[N];
    tp_philox_noise_fill(7, 3, 0, ROWS, DIM, 1, 1.0f, z);
    double mean, var, m4;
    s_moments(z, N, &mean, &var, &m4);
    int tail = 0, zeros = 0;
    for (int i = 0; i < N; i++) {
        tail += fabsf(z[i]) > 2.0f;
        zeros += z[i] == 0.0f;
    }
    cr_assert_lt(fabs(mean), 0.03, "mean %g", mean);
    cr_assert_lt(fabs(var - 1.0), 0.03, "variance %g", var);
    cr_assert_lt(fabs(m4 / (var * var) - 3.0), 0.15, "kurtosis %g", m4 / (var * var));
    /* P(|z| > 2) = 0.0455: 1165 of 25600, sd 33 */
    cr_assert(tail > 1000 && tail < 1330, "%d beyond 2 sd", tail);
    cr_assert_eq(zeros, 0, "%d exact zeros (16 rejected attempts?)", zeros);
    /* scale multiplies the float result: N(0, 9) is 3 x N(0, 1) */
    static float w[N];
    tp_philox_noise_fill(7, 3, 0, ROWS, DIM, 1, 3.0f, w);
    for (int i = 0; i < N; i++)
        cr_assert(w[i] == 3.0f * z[i]);
}

/* A number depends on (seed, step, row, element) alone: drawn alone, in a
 * split batch, or in any order, it is the same; a change of any of the
 * four gives others. */
Test(philox, noise_is_a_pure_function_of_seed_step_row_and_element) {
    for (int normal = 0; normal < 2; normal++) {
        static float a[N], b[N];
        tp_philox_noise_fill(11, 5, 0, ROWS, DIM, normal, 1.0f, a);
        tp_philox_noise_fill(11, 5, 0, 100, DIM, normal, 1.0f, b);
        tp_philox_noise_fill(11, 5, 100, ROWS - 100, DIM, normal, 1.0f, b + 100 * DIM);
        cr_assert_eq(memcmp(a, b, sizeof a), 0, "a split batch differs (normal %d)", normal);
        for (int i = N - 1; i >= 0; i -= 97)
            cr_assert(tp_philox_noise(11, 5, i / DIM, i % DIM, normal, 1.0f) == a[i]);
        int same_step = 0, same_seed = 0, same_row = 0;
        for (int i = 0; i < DIM; i++) {
            same_step += tp_philox_noise(11, 6, 0, i, normal, 1.0f) == a[i];
            same_seed += tp_philox_noise(12, 5, 0, i, normal, 1.0f) == a[i];
            same_row += tp_philox_noise(11, 5, 1, i, normal, 1.0f) == a[i];
        }
        cr_assert(same_step < 3 && same_seed < 3 && same_row < 3,
                  "normal %d: %d/%d/%d of %d equal with another step/seed/row", normal,
                  same_step, same_seed, same_row, DIM);
        /* step -1 (tp-generate, the sample grids) is a stream of its own */
        int same_m1 = 0;
        for (int i = 0; i < DIM; i++)
            same_m1 += tp_philox_noise(11, -1, 0, i, normal, 1.0f) == a[i];
        cr_assert_lt(same_m1, 3);
    }
}

/* The GAN trainers' noise is the shared function's, number for number:
 * what gpu/cuda/noise.cu computes on the device. */
Test(philox, gan_noise_fill_draws_the_shared_functions_numbers) {
    tp_gan_config_t gc;
    tp_gan_config_init(&gc);
    gc.seed = 0x123456789abcull;
    static float a[N], b[N];
    for (int normal = 0; normal < 2; normal++) {
        gc.noise = normal ? TP_GAN_NOISE_NORMAL : TP_GAN_NOISE_UNIFORM;
        gc.noise_scale = normal ? 1.0f : 0.5f;
        tp_gan_noise_fill(&gc, 41, 64, ROWS, DIM, a);
        for (int i = 0; i < N; i++)
            b[i] = tp_philox_noise(gc.seed, 41, 64 + i / DIM, i % DIM, normal,
                                   gc.noise_scale);
        cr_assert_eq(memcmp(a, b, sizeof a), 0, "normal %d", normal);
    }
}
