/* towerpack tests: a suite's scratch directory under /tmp: made at the
 * suite's setup, a file's path in it, removed with all it holds at the
 * teardown (without a shell). Include after Criterion. */
#ifndef TP_TESTS_DIR_TESTUTIL_H
#define TP_TESTS_DIR_TESTUTIL_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* /tmp/PREFIX_XXXXXX made into dir[size] (the test fails when it cannot). */
static inline void dt_make(char *dir, size_t size, const char *prefix) {
    snprintf(dir, size, "/tmp/%s_XXXXXX", prefix);
    cr_assert_not_null(mkdtemp(dir), "%s", dir);
}

/* A fresh /tmp/PREFIX_XXXXXX in one of four buffers that take turns (a
 * test may hold up to four at once); the test fails when it cannot. */
static inline char *dt_new(const char *prefix) {
    static char dirs[4][64];
    static int k;
    char *d = dirs[k++ % 4];
    dt_make(d, sizeof dirs[0], prefix);
    return d;
}

/* dir/name, in one of four buffers that take turns (a call's arguments
 * may hold up to four paths at once). */
static inline const char *dt_path(const char *dir, const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* dir and all it holds removed (a directory in it too), a warning when it
 * cannot be. */
static inline void dt_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            int n = snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (n < 0 || (size_t)n >= sizeof p)
                continue; /* too long: the rmdir below warns */
            if (unlink(p) != 0)
                dt_remove(p); /* a directory */
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        cr_log_warn("could not remove %s", dir);
}

#endif
