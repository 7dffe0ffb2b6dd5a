/* towerpack tests: the optimizer constructors when memory runs out. They
 * returned NULL with no message (tp_last_error() empty, or an older
 * error's), and tp_optimizer_adamw blamed its hyper-parameters; each NULL
 * now says what failed (the project's rule: every NULL return sets the
 * error). Own executable: it is linked with -Wl,--wrap=calloc
 * (tests/CMakeLists.txt), so the library's calloc fails on demand. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <towerpack/optim.h>
#include <towerpack/status.h>

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

static int s_fail;  /* the next s_fail callocs fail */

void *__wrap_calloc(size_t n, size_t size) {
    if (s_fail > 0) {
        s_fail--;
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

/* o is NULL, made while calloc failed, and the error names `kind` and the
 * lack of memory. */
static void s_assert_no_memory(tp_optimizer_t *o, const char *kind) {
    char want[64];
    snprintf(want, sizeof want, "%s: no memory for the optimizer", kind);
    cr_assert_null(o, "%s: made without memory", kind);
    cr_assert_eq(s_fail, 0, "%s: calloc was not asked", kind);
    cr_assert(strstr(tp_last_error(), want), "%s: the error says '%s'", kind,
              tp_last_error());
}

Test(optim_nomem, every_constructor_says_what_failed) {
    tp_clear_error();
    s_fail = 1;
    s_assert_no_memory(tp_optimizer_sgd(0.1, 0.9, 0), "sgd");
    tp_clear_error();
    s_fail = 1;
    s_assert_no_memory(tp_optimizer_adam(1e-3, 0.9, 0.999, 1e-8), "adam");
    tp_clear_error();
    s_fail = 1;
    s_assert_no_memory(tp_optimizer_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01), "adamw");
    /* with memory, each is made (the wrap passes through) */
    const char *kinds[] = {"sgd", "adam", "adamw"};
    tp_optimizer_t *made[] = {tp_optimizer_sgd(0.1, 0.9, 0),
                              tp_optimizer_adam(1e-3, 0.9, 0.999, 1e-8),
                              tp_optimizer_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01)};
    for (int i = 0; i < 3; i++) {
        cr_assert_not_null(made[i], "%s: %s", kinds[i], tp_last_error());
        cr_assert_str_eq(tp_optimizer_kind(made[i]), kinds[i]);
        tp_optimizer_destroy(&made[i]);
    }
}

/* Bad hyper-parameters still name the constructor and them (adamw's were
 * adam's message rewritten; now its own from the start). */
Test(optim_nomem, bad_hyper_parameters_name_the_kind) {
    cr_assert_null(tp_optimizer_adamw(1e-3, 1.5, 0.999, 1e-8, 0.01));
    cr_assert(strstr(tp_last_error(), "adamw: lr 0.001, beta1 1.5, beta2 0.999"), "%s",
              tp_last_error());
    cr_assert_null(tp_optimizer_adam(-1, 0.9, 0.999, 1e-8));
    cr_assert(strstr(tp_last_error(), "adam: lr -1, beta1 0.9"), "%s", tp_last_error());
}
