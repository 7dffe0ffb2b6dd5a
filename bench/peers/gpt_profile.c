/* towerpack bench: the GPT step's CPU time per op kind, at 1 thread and at
 * T threads in one process (issue 45; docs/performance.md, "The GPT step
 * per op on the CPU").
 *
 * tp-bench step --profile profiles the MLP and the CNN only; this is the
 * same measurement for the zoo's GPT at gpt_cpu.sh's shape (4 layers,
 * width 256, 4 heads, context 256, batch 4, AdamW): each model takes 3
 * warm-up steps, then ROUNDS rounds of 2 profiled steps, and the round
 * with the least tower-thread CPU time is kept. Per op kind (the sums
 * over the layers): the tower thread's CPU ms a step at 1 thread (thr@1)
 * and at T (thr@T), the process's at T (proc@T), their ratio (team: near
 * T when the team worked through the op) and the parallel fraction par =
 * (1 - thr@T/thr@1) T/(T-1); then the Amdahl bound at T from the 1-thread
 * times (each kind's serial part plus the time between ops: the fused
 * update, the plan walk). Run with OMP_WAIT_POLICY=passive on a loaded
 * host, or the team's spin waits count as work. Tokens are a fixed
 * pattern (the step's cost does not depend on them).
 *
 *   cc -O2 -Iinclude -Ibuild/include bench/peers/gpt_profile.c \
 *      build/lib/libtowerpack_models.a -Lbuild/lib -ltowerpack -lm -o /tmp/gpt_profile
 *   OMP_WAIT_POLICY=passive LD_LIBRARY_PATH=build/lib /tmp/gpt_profile [T [ROUNDS]]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <towerpack/models.h>
#include <towerpack/towerpack.h>

enum { L = 4, H = 4, C = 256, CTX = 256, B = 4, NOPS = 512, NKINDS = 256 };

typedef struct {
    double thr[NKINDS], proc[NKINDS]; /* ns a step per op kind */
    double step_thr, step_proc, between; /* ns a step */
} prof_t;

static double s_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static tp_optimizer_t *s_opt(void *u) {
    (void)u;
    return tp_optimizer_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1);
}

/* The best round of `rounds` at `threads` threads into *out; 0 or -1. */
static int s_profile(int threads, int rounds, prof_t *out) {
    tp_zoo_gpt_options_t o;
    memset(&o, 0, sizeof o);
    o.layers = L, o.heads = H, o.embed = C;
    tp_input_desc_t in[2];
    if (tp_zoo_gpt_inputs(CTX, in) != TP_OK)
        return -1;
    tp_model_desc_t md = {in, 2, tp_zoo_gpt_build, s_opt, &o};
    tp_model_config_t cfg = tp_model_config_default();
    cfg.batch = B, cfg.seed = 1, cfg.threads = threads;
    tp_model_t *m = tp_model_new(&md, &cfg);
    if (!m) {
        fprintf(stderr, "gpt_profile: %s\n", tp_last_error());
        return -1;
    }
    static int32_t tok[B * CTX], tgt[B * CTX];
    for (int i = 0; i < B * CTX; i++)
        tok[i] = (i * 37) % 256, tgt[i] = (i * 37 + 11) % 256;
    int64_t s[2] = {B, CTX};
    tp_tensor_t x[2];
    tp_tensor_init_wrap(&x[0], TP_INT32, 2, s, tok, NULL, NULL);
    tp_tensor_init_wrap(&x[1], TP_INT32, 2, s, tgt, NULL, NULL);
    for (int i = 0; i < 3; i++)
        if (tp_model_run(m, 0, x, 2, NULL, 0, NULL) != TP_OK) {
            fprintf(stderr, "gpt_profile: %s\n", tp_last_error());
            tp_model_destroy(&m);
            return -1;
        }
    static tp_op_profile_t pr[NOPS];
    for (int rd = 0; rd < rounds; rd++) {
        tp_model_set_profiling(m, 1);
        const double t0 = s_clock(CLOCK_THREAD_CPUTIME_ID), p0 = s_clock(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < 2; i++)
            tp_model_run(m, 0, x, 2, NULL, 0, NULL);
        const double t = (s_clock(CLOCK_THREAD_CPUTIME_ID) - t0) / 2,
                     p = (s_clock(CLOCK_PROCESS_CPUTIME_ID) - p0) / 2;
        if (rd > 0 && t >= out->step_thr)
            continue;
        int n = tp_model_profile(m, 0, pr, NOPS);
        n = n < NOPS ? n : NOPS;
        memset(out, 0, sizeof *out);
        out->step_thr = t, out->step_proc = p, out->between = t;
        for (int i = 0; i < n; i++) {
            const double ti = (double)(pr[i].thread_forward_ns + pr[i].thread_backward_ns) / 2;
            const double pi = (double)(pr[i].process_forward_ns + pr[i].process_backward_ns) / 2;
            out->thr[pr[i].kind % NKINDS] += ti;
            out->proc[pr[i].kind % NKINDS] += pi;
            out->between -= ti;
        }
    }
    tp_model_destroy(&m);
    return 0;
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (T < 2 || rounds < 1) {
        fprintf(stderr, "usage: gpt_profile [THREADS>=2 [ROUNDS]]\n");
        return 2;
    }
    static prof_t one, many;
    if (s_profile(1, rounds, &one) || s_profile(T, rounds, &many))
        return 1;
    printf("GPT %d layers, width %d, %d heads, context %d, batch %d: CPU ms a step "
           "(best of %d rounds)\n", L, C, H, CTX, B, rounds);
    printf("  %-18s %8s %6s %8s %8s %5s %5s\n", "op kind", "thr@1", "share", "thr@T", "proc@T",
           "team", "par");
    double serial = 0, par1 = 0;
    for (;;) { /* kinds by their 1-thread time, largest first */
        int k = -1;
        for (int i = 0; i < NKINDS; i++)
            if (one.thr[i] > 0 && (k < 0 || one.thr[i] > one.thr[k]))
                k = i;
        if (k < 0)
            break;
        const double c1 = one.thr[k] / 1e6, cT = many.thr[k] / 1e6, pT = many.proc[k] / 1e6;
        double par = (1.0 - cT / c1) * T / (T - 1);
        par = par < 0 ? 0 : par > 1 ? 1 : par;
        serial += c1 * (1 - par), par1 += c1 * par;
        printf("  %-18s %8.2f %5.1f%% %8.2f %8.2f %5.2f %5.2f%s\n", tp_op_name((tp_op_kind_t)k),
               c1, 100 * one.thr[k] / one.step_thr, cT, pT, cT > 0 ? pT / cT : 0, par,
               par < 0.5 ? "  serial" : "");
        one.thr[k] = 0;
    }
    const double b1 = one.between > 0 ? one.between / 1e6 : 0;
    printf("  %-18s %8.2f %6s %8.2f\n", "between ops", b1, "", many.between / 1e6);
    printf("  %-18s %8.2f %6s %8.2f %8.2f %5.2f\n", "step", one.step_thr / 1e6, "",
           many.step_thr / 1e6, many.step_proc / 1e6,
           many.step_thr > 0 ? many.step_proc / many.step_thr : 0);
    serial += b1;
    printf("Amdahl bound at %d threads: serial %.2f ms of %.2f -> %.2fx; the thread times "
           "say %.2fx\n", T, serial, one.step_thr / 1e6,
           one.step_thr / 1e6 / (serial + par1 / T),
           many.step_thr > 0 ? one.step_thr / many.step_thr : 0);
    return 0;
}
