/* towerpack tests: SGD (plain, momentum, Nesterov) and Adam against
 * reference arithmetic in double, and hyper-parameters by name. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <towerpack/towerpack.h>

#define NP 5

static void s_run(tp_optimizer_t *o, float *w, float g[][NP], int steps,
                  float *slot0, float *slot1) {
    tp_backend_t *b = tp_backend_cpu_new(1);
    cr_assert_not_null(b);
    float *slots[2] = {slot0, slot1};
    for (int s = 0; s < steps; s++)
        cr_assert_eq(tp_optimizer_apply(o, b, NULL, w, g[s], slots, NP), TP_OK);
    tp_backend_destroy(&b);
    cr_expect_null(b);
}

static float s_g[3][NP] = {{0.5f, -1.0f, 2.0f, 0.0f, 0.25f},
                           {-0.5f, 0.3f, 1.0f, -2.0f, 0.75f},
                           {1.5f, 0.1f, -0.2f, 0.4f, -1.0f}};

Test(optim, sgd_momentum_and_nesterov_match_reference) {
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        tp_optimizer_t *o = tp_optimizer_sgd(0.1, 0.9, nesterov);
        cr_assert_not_null(o);
        cr_expect_eq(tp_optimizer_slot_count(o), 1);
        cr_expect_str_eq(tp_optimizer_slot_name(o, 0), "momentum");
        float w[NP] = {1, 2, 3, 4, 5}, v[NP] = {0};
        s_run(o, w, s_g, 3, v, NULL);
        for (int i = 0; i < NP; i++) {
            double rw = i + 1, rv = 0;
            for (int s = 0; s < 3; s++) {
                rv = 0.9 * rv + s_g[s][i];
                rw -= 0.1 * (nesterov ? s_g[s][i] + 0.9 * rv : rv);
            }
            cr_expect(fabs(w[i] - rw) < 1e-5, "nesterov %d w[%d] %f vs %f",
                      nesterov, i, w[i], rw);
        }
        cr_expect_eq(tp_optimizer_step(o), 3);
        tp_optimizer_destroy(&o);
        cr_expect_null(o);
    }
}

Test(optim, plain_sgd_keeps_no_slot) {
    tp_optimizer_t *o = tp_optimizer_sgd(0.5, 0.0, 0);
    cr_expect_eq(tp_optimizer_slot_count(o), 0);
    float w[NP] = {0};
    s_run(o, w, s_g, 1, NULL, NULL);
    cr_expect_float_eq(w[1], 0.5f, 1e-7);
    /* momentum cannot be switched on later: no slot was planned */
    cr_expect_eq(tp_optimizer_set(o, "momentum", 0.9), TP_ERR_INVALID);
    tp_optimizer_destroy(&o);
}

Test(optim, adam_matches_reference) {
    tp_optimizer_t *o = tp_optimizer_adam(0.01, 0.9, 0.999, 1e-8);
    cr_assert_not_null(o);
    cr_expect_eq(tp_optimizer_slot_count(o), 2);
    cr_expect_str_eq(tp_optimizer_slot_name(o, 1), "v");
    float w[NP] = {1, -1, 0.5f, 0, 2}, m[NP] = {0}, v[NP] = {0};
    float w0[NP];
    memcpy(w0, w, sizeof w);
    s_run(o, w, s_g, 3, m, v);
    for (int i = 0; i < NP; i++) {
        double rw = w0[i], rm = 0, rv = 0;
        for (int s = 0; s < 3; s++) {
            double g = s_g[s][i];
            rm = 0.9 * rm + 0.1 * g;
            rv = 0.999 * rv + 0.001 * g * g;
            double mh = rm / (1 - pow(0.9, s + 1)), vh = rv / (1 - pow(0.999, s + 1));
            rw -= 0.01 * mh / (sqrt(vh) + 1e-8);
        }
        cr_expect(fabs(w[i] - rw) < 1e-5, "w[%d] %f vs %f", i, w[i], rw);
    }
    tp_optimizer_destroy(&o);
}

Test(optim, hyper_parameters_by_name) {
    tp_optimizer_t *o = tp_optimizer_adam(0.001, 0.9, 0.999, 1e-7);
    double v;
    cr_expect_eq(tp_optimizer_set(o, "learning_rate", 0.5), TP_OK);
    cr_expect_eq(tp_optimizer_get(o, "learning_rate", &v), TP_OK);
    cr_expect_float_eq(v, 0.5, 1e-12);
    cr_expect_eq(tp_optimizer_set(o, "beta1", 0.8), TP_OK);
    cr_expect_eq(tp_optimizer_get(o, "beta1", &v), TP_OK);
    cr_expect_float_eq(v, 0.8, 1e-12);
    cr_expect_eq(tp_optimizer_set(o, "beta1", 1.5), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "epsilon", 0.0), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_set(o, "learning_rate", -1), TP_ERR_INVALID);
    cr_expect_eq(tp_optimizer_get(o, "momentum", &v), TP_ERR_NOT_FOUND);
    cr_expect(strstr(tp_last_error(), "beta2") != NULL, "%s", tp_last_error());
    cr_expect_str_eq(tp_optimizer_kind(o), "adam");
    tp_optimizer_destroy(&o);
    cr_expect_null(tp_optimizer_sgd(0.1, 1.0, 0));
    cr_expect_null(tp_optimizer_adam(0.1, 0.9, 0.999, 0.0));
}
