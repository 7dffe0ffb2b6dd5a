/* towerpack tests: a minimal stand-in for Criterion's test API, used only in
 * ThreadSanitizer builds. Criterion's forked runner cannot start under TSan
 * (its inheritable arena collides with TSan's memory layout: Criterion issue
 * #274), so under TP_SANITIZE=thread the same test files compile against
 * this header and run in one process, one test after another.
 *
 * Supported: Test(suite, name, .init, .fini, .timeout, .disabled),
 * TestSuite(suite, .init, .fini) (the suite's init/fini run for each of its
 * tests that has none of its own; other suite options are ignored), cr_assert* / cr_expect* (plain, eq, neq, lt, leq, gt, geq, null,
 * not_null, not, str_eq, str_neq, float_eq, arr_eq), cr_assert_fail,
 * cr_skip_test, cr_log_info/warn/error. Tests that expect a signal or an exit
 * code (.signal, .exit_code) need Criterion's fork and are skipped here. */
#ifndef TP_TEST_SHIM_CRITERION_H
#define TP_TEST_SHIM_CRITERION_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct criterion_test_extra_data {
    void (*init)(void);
    void (*fini)(void);
    double timeout;
    int disabled;
    int signal;
    int exit_code;
    const char *description;
};

struct tp_shim_test {
    const char *suite;
    const char *name;
    void (*fn)(void);
    struct criterion_test_extra_data extra;
    struct tp_shim_test *next;
};

struct tp_shim_suite {
    const char *suite;
    struct criterion_test_extra_data extra;
    struct tp_shim_suite *next;
};

void tp_shim_register(struct tp_shim_test *t);
void tp_shim_register_suite(struct tp_shim_suite *s);
void tp_shim_fail(const char *file, int line, int fatal, const char *expr,
                  const char *fmt, ...);
/* (no format attribute: the message may be the empty literal) */
void tp_shim_skip(const char *fmt, ...);
void tp_shim_log(const char *level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define TP_SHIM_CAT_(a, b) a##b
#define TP_SHIM_CAT(a, b) TP_SHIM_CAT_(a, b)

#define Test(suite, name, ...)                                                \
    static void suite##_##name##_impl(void);                                  \
    static struct tp_shim_test suite##_##name##_desc = {                      \
        #suite, #name, suite##_##name##_impl,                                 \
        {__VA_ARGS__}, NULL};  /* empty: all zero */                      \
    __attribute__((constructor)) static void suite##_##name##_reg(void) {     \
        tp_shim_register(&suite##_##name##_desc);                             \
    }                                                                         \
    static void suite##_##name##_impl(void)

#define TestSuite(suite, ...)                                                 \
    static struct tp_shim_suite tp_shim_suite_##suite = {                     \
        #suite, {__VA_ARGS__}, NULL};  /* empty: all zero */              \
    __attribute__((constructor)) static void tp_shim_suite_reg_##suite(void) { \
        tp_shim_register_suite(&tp_shim_suite_##suite);                       \
    }                                                                         \
    static int TP_SHIM_CAT(tp_shim_suite_end_, __LINE__) __attribute__((unused))

#define tp_shim_check_(fatal, cond, expr, ...)                                \
    do {                                                                      \
        if (!(cond))                                                          \
            tp_shim_fail(__FILE__, __LINE__, fatal, expr, "" __VA_ARGS__);    \
    } while (0)

#define cr_assert(cond, ...) tp_shim_check_(1, (cond), #cond, __VA_ARGS__)
#define cr_expect(cond, ...) tp_shim_check_(0, (cond), #cond, __VA_ARGS__)
#define cr_assert_not(c, ...) tp_shim_check_(1, !(c), "!(" #c ")", __VA_ARGS__)
#define cr_expect_not(c, ...) tp_shim_check_(0, !(c), "!(" #c ")", __VA_ARGS__)
#define TP_SHIM_CMP_(f, a, op, b, ...)                                        \
    tp_shim_check_(f, (a) op (b), #a " " #op " " #b, __VA_ARGS__)
#define cr_assert_eq(a, b, ...) TP_SHIM_CMP_(1, a, ==, b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) TP_SHIM_CMP_(1, a, !=, b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) TP_SHIM_CMP_(1, a, <, b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) TP_SHIM_CMP_(1, a, <=, b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) TP_SHIM_CMP_(1, a, >, b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) TP_SHIM_CMP_(1, a, >=, b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) TP_SHIM_CMP_(0, a, ==, b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) TP_SHIM_CMP_(0, a, !=, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) TP_SHIM_CMP_(0, a, <, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) TP_SHIM_CMP_(0, a, <=, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) TP_SHIM_CMP_(0, a, >, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) TP_SHIM_CMP_(0, a, >=, b, __VA_ARGS__)
#define cr_assert_null(p, ...) TP_SHIM_CMP_(1, (const void *)(p), ==, NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) TP_SHIM_CMP_(1, (const void *)(p), !=, NULL, __VA_ARGS__)
#define cr_expect_null(p, ...) TP_SHIM_CMP_(0, (const void *)(p), ==, NULL, __VA_ARGS__)
#define cr_expect_not_null(p, ...) TP_SHIM_CMP_(0, (const void *)(p), !=, NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...)                                           \
    tp_shim_check_(1, strcmp((a), (b)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...)                                          \
    tp_shim_check_(1, strcmp((a), (b)) != 0, #a " != " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...)                                           \
    tp_shim_check_(0, strcmp((a), (b)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...)                                    \
    tp_shim_check_(1, fabs((double)(a) - (double)(b)) <= (eps),               \
                   #a " ~= " #b, __VA_ARGS__)
#define cr_expect_float_eq(a, b, eps, ...)                                    \
    tp_shim_check_(0, fabs((double)(a) - (double)(b)) <= (eps),               \
                   #a " ~= " #b, __VA_ARGS__)
#define cr_assert_arr_eq(a, b, size, ...)                                     \
    tp_shim_check_(1, memcmp((a), (b), (size)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_fail(...) tp_shim_fail(__FILE__, __LINE__, 1, "fail", "" __VA_ARGS__)
#define cr_skip_test(...) tp_shim_skip("" __VA_ARGS__)
#define cr_log_info(...) tp_shim_log("info", __VA_ARGS__)
#define cr_log_warn(...) tp_shim_log("warn", __VA_ARGS__)
#define cr_log_error(...) tp_shim_log("error", __VA_ARGS__)

#endif
