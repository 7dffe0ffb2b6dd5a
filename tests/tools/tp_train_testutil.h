/* towerpack tests: what the tp-train suites (test_proc_tp_train*.c) share:
 * running the tool with info logging (and tp-generate with warnings),
 * writing a corpus, reading back a file and its stats.json, --bf16's three
 * runs, removing the suite's directory. Include after proc_testutil.h, Criterion and jansson. */
#ifndef TP_TESTS_TP_TRAIN_TESTUTIL_H
#define TP_TESTS_TP_TRAIN_TESTUTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Run tp-train with argv (NULL-terminated, argv[0] ignored), stdout+stderr
 * into out[size]; the exit status (or -1 when killed after 120 s). */
static inline int tpt_run(char *const *argv, char *out, size_t size) {
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    char *full[64] = {TP_BINARY_DIR "/bin/tp-train"};
    for (int i = 1; i < 63 && (full[i] = argv[i]); i++) {}
    return pu_run(full, env, out, size);
}

/* Run tp-generate with argv (NULL-terminated, argv[0] ignored), warnings
 * only, stdout+stderr into out[size]; the exit status. */
static inline int tpt_generate(char *const *argv, char *out, size_t size) {
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    char *full[32] = {TP_BINARY_DIR "/bin/tp-generate"};
    for (int i = 1; i < 31 && (full[i] = argv[i]); i++) {}
    return pu_run(full, env, out, size);
}

/* Write `text` n times over to path: a corpus a tiny model can learn. */
static inline void tpt_write_repeated(const char *path, const char *text, int n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    for (int i = 0; i < n; i++)
        fputs(text, f);
    cr_assert_eq(fclose(f), 0, "%s", path);
}

/* The file at path into buf[size], NUL-terminated (the test fails when it
 * cannot be opened); its length. */
static inline size_t tpt_read_file(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = 0;
    return n;
}

/* The text suites' fixture: a fresh /tmp/PREFIX-XXXXXX into dir[dsize]
 * and, in it, corpus.txt (its path into file[fsize]): a sentence repeated
 * 800 times, 36 kB, which a tiny GPT learns in a few hundred steps. */
static inline void tpt_make_corpus(char *dir, size_t dsize, char *file, size_t fsize,
                                   const char *prefix) {
    snprintf(dir, dsize, "/tmp/%s-XXXXXX", prefix);
    cr_assert_not_null(mkdtemp(dir), "%s", dir);
    snprintf(file, fsize, "%s/corpus.txt", dir);
    tpt_write_repeated(file, "the quick brown fox jumps over the lazy dog. ", 800);
}

/* LOGDIR/stats.json, parsed (the test fails when it is not there). */
static inline json_t *tpt_stats(const char *logdir) {
    char path[512];
    int n = snprintf(path, sizeof path, "%s/stats.json", logdir);
    cr_assert(n > 0 && (size_t)n < sizeof path, "%s: too long", logdir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    cr_assert_not_null(j, "%s: %s", path, err.text);
    return j;
}

/* The number `key` of a stats.json record (the test fails without it). */
static inline double tpt_num(json_t *rec, const char *key) {
    json_t *v = json_object_get(rec, key);
    cr_assert(json_is_number(v), "stats.json has no number '%s'", key);
    return json_number_value(v);
}

/* --bf16 on the CPU as a user meets it: argv (NULL-terminated, ending in
 * "--logdir", NULL, NULL, NULL: the log directory and --bf16 go there)
 * run three times into dir/bf16-K: fp32, --bf16, and --bf16
 * where oneDNN sees no bf16 instructions (capped, as on a CPU without
 * them). The first epoch's costs must say bf16 ran: within 2% of fp32's
 * and not equal to it, and fp32's bit for bit when unavailable; the runs'
 * logs say so (the info line, the warning). out[size]: the last run's
 * output. */
static inline void tpt_bf16_trains_as_fp32(char **argv, const char *dir, char *out,
                                           size_t size) {
    int at = 0;
    while (argv[at] && strcmp(argv[at], "--logdir") != 0)
        at++;
    cr_assert(argv[at], "tpt_bf16_trains_as_fp32: argv has no --logdir");
    at++;
    char logdir[3][256];
    double cost[3];
    for (int k = 0; k < 3; k++) {
        if (k == 2)
            setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE", 1);
        snprintf(logdir[k], sizeof logdir[k], "%s/bf16-%d", dir, k);
        argv[at] = logdir[k];
        argv[at + 1] = k ? "--bf16" : NULL;
        int rc = tpt_run(argv, out, size);
        cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
        const int said = strstr(out, "bf16: the CPU's matrix products on bf16") != NULL;
        cr_assert_eq(said, k == 1, "run %d:\n%s", k, out);
        if (k == 2)
            cr_assert(strstr(out, "this CPU has no bf16 dot products"), "%s", out);
        json_t *j = tpt_stats(logdir[k]);
        cost[k] = tpt_num(json_array_get(j, 0), "cost");
        json_decref(j);
    }
    unsetenv("ONEDNN_MAX_CPU_ISA");
    cr_assert(cost[1] != cost[0], "--bf16 trained as fp32: cost %g", cost[0]);
    cr_assert(fabs(cost[1] - cost[0]) < 0.02 * cost[0], "--bf16 cost %g, fp32 %g", cost[1],
              cost[0]);
    cr_assert_eq(cost[2], cost[0], "bf16 unavailable: cost %.9g, fp32 %.9g", cost[2], cost[0]);
    cr_log_info("cost: fp32 %.6f, bf16 %.6f", cost[0], cost[1]);
}

/* rm -rf dir, a warning when it cannot. */
static inline void tpt_remove_dir(const char *dir) {
    char cmd[512];
    int n = snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (n < 0 || (size_t)n >= sizeof cmd || system(cmd) != 0)
        cr_log_warn("could not remove %s", dir);
}

#endif
