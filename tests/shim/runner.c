/* towerpack tests: the runner behind tests/shim/criterion/criterion.h (see
 * there). Runs every registered test in this process, in registration
 * order, and ends with Criterion's "Synthesis" line and a plain
 * "N passed, N failed" line. Arguments: --filter SUBSTRING (optional);
 * Criterion's other flags are accepted and ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include "criterion/criterion.h"

static struct tp_shim_test *s_head, **s_tail = &s_head;
static struct tp_shim_suite *s_suites;
static jmp_buf s_jump;
static int s_failed_now;

void tp_shim_register(struct tp_shim_test *t) {
    *s_tail = t;
    s_tail = &t->next;
}

void tp_shim_register_suite(struct tp_shim_suite *s) {
    s->next = s_suites;
    s_suites = s;
}

/* A test without its own init/fini takes its suite's (as Criterion does). */
static void s_suite_defaults(struct tp_shim_test *t) {
    for (struct tp_shim_suite *s = s_suites; s; s = s->next) {
        if (strcmp(s->suite, t->suite) != 0)
            continue;
        if (!t->extra.init)
            t->extra.init = s->extra.init;
        if (!t->extra.fini)
            t->extra.fini = s->extra.fini;
    }
}

void tp_shim_fail(const char *file, int line, int fatal, const char *expr,
                  const char *fmt, ...) {
    fprintf(stderr, "[FAIL] %s:%d: %s", file, line, expr);
    if (fmt && *fmt) {
        fprintf(stderr, ": ");
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fprintf(stderr, "\n");
    s_failed_now = 1;
    if (fatal)
        longjmp(s_jump, 1);
}

void tp_shim_skip(const char *fmt, ...) {
    fprintf(stderr, "[SKIP] ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    longjmp(s_jump, 2);
}

void tp_shim_log(const char *level, const char *fmt, ...) {
    fprintf(stderr, "[%s] ", level);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

int main(int argc, char **argv) {
    /* static: these survive the longjmp out of a failed test */
    static const char *filter = NULL;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--filter") && i + 1 < argc)
            filter = argv[++i];
    static int passed, failed, skipped;
    static struct tp_shim_test *t;
    for (t = s_head; t; t = t->next) {
        char full[256];
        snprintf(full, sizeof full, "%s::%s", t->suite, t->name);
        if (filter && !strstr(full, filter))
            continue;
        if (t->extra.disabled || t->extra.signal || t->extra.exit_code) {
            fprintf(stderr, "[SKIP] %s (needs Criterion's forked runner)\n", full);
            skipped++;
            continue;
        }
        s_suite_defaults(t);
        fprintf(stderr, "[RUN ] %s\n", full);
        s_failed_now = 0;
        int jumped = setjmp(s_jump);
        if (jumped == 0) {
            if (t->extra.init)
                t->extra.init();
            t->fn();
        }
        if (jumped != 2 && t->extra.fini)
            t->extra.fini();
        if (jumped == 2) {
            skipped++;
        } else if (s_failed_now) {
            failed++;
        } else {
            passed++;
            fprintf(stderr, "[PASS] %s\n", full);
        }
    }
    fprintf(stderr, "[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: 0\n",
            passed + failed, passed, failed);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
