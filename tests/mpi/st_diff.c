/* towerpack tests: compare the tensors two safetensors checkpoints have in
 * common (the MPI parity test's judge).
 *
 *   tp-st-diff A.safetensors B.safetensors TOL [PREFIX]
 *
 * Prints how many tensors were compared, the largest absolute difference and
 * whether every compared tensor is bit-identical; exits 0 when that
 * difference is <= TOL and at least one float tensor was compared, 1
 * otherwise (naming the worst tensor), 2 on a bad file. With PREFIX only
 * tensors whose names start with it count; with !PREFIX only those that do
 * not ("!optimizer/": the variables alone). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/checkpoint.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: tp-st-diff A B TOL [PREFIX]\n");
        return 2;
    }
    double tol = atof(argv[3]);
    const char *prefix = argc > 4 ? argv[4] : "";
    int exclude = prefix[0] == '!';
    if (exclude)
        prefix++;
    tp_safetensors_t *a = NULL, *b = NULL;
    if (tp_safetensors_open(argv[1], &a) != TP_OK ||
        tp_safetensors_open(argv[2], &b) != TP_OK) {
        fprintf(stderr, "tp-st-diff: %s\n", tp_last_error());
        tp_safetensors_destroy(&a);
        return 2;
    }
    size_t compared = 0, identical = 0;
    double worst = 0;
    char worst_name[256] = "";
    int rc = 0;
    for (size_t i = 0; i < tp_safetensors_count(a); i++) {
        const char *name = tp_safetensors_name(a, i);
        if ((strncmp(name, prefix, strlen(prefix)) == 0) == exclude)
            continue;
        tp_tensor_t x, y;
        if (tp_safetensors_get(a, name, &x) != TP_OK || x.dtype != TP_FLOAT32)
            continue;
        if (tp_safetensors_get(b, name, &y) != TP_OK) {
            fprintf(stderr, "tp-st-diff: %s is in %s but not in %s\n", name,
                    argv[1], argv[2]);
            rc = 1;
            continue;
        }
        if (y.dtype != TP_FLOAT32 || y.nbytes != x.nbytes) {
            fprintf(stderr, "tp-st-diff: %s differs in dtype or size\n", name);
            rc = 1;
            continue;
        }
        const float *p = x.data, *q = y.data;
        size_t n = x.nbytes / sizeof(float);
        double d = 0;
        for (size_t k = 0; k < n; k++) {
            double e = fabs((double)p[k] - (double)q[k]);
            if (!(e <= d))   /* NaN counts as the worst */
                d = isnan(e) ? INFINITY : e;
        }
        compared++;
        identical += memcmp(x.data, y.data, x.nbytes) == 0;
        if (d > worst || !worst_name[0]) {
            if (d >= worst) {
                worst = d;
                snprintf(worst_name, sizeof worst_name, "%s", name);
            }
        }
    }
    printf("tp-st-diff: %zu float tensors compared, max |diff| %.3g (%s), "
           "%zu bit-identical\n", compared, worst, worst_name, identical);
    if (compared == 0) {
        fprintf(stderr, "tp-st-diff: no float tensors in common\n");
        rc = 1;
    } else if (!(worst <= tol)) {
        fprintf(stderr, "tp-st-diff: %s differs by %.3g > %g\n", worst_name,
                worst, tol);
        rc = 1;
    }
    tp_safetensors_destroy(&a);
    tp_safetensors_destroy(&b);
    return rc;
}
