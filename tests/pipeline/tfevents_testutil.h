/* towerpack tests: running tests/pipeline/check_tfevents.py, the reader of
 * TensorBoard event files built on Python's protobuf and crcmod. */
#ifndef TP_TFEVENTS_TESTUTIL_H
#define TP_TFEVENTS_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define TE_CHECKER TP_SOURCE_DIR "/tests/pipeline/check_tfevents.py"

/* A python3 that has google.protobuf and crcmod, and protoc on the PATH:
 * the first of `python3` on the PATH and Debian's /usr/bin/python3 (a
 * pyenv or venv python3 first on the PATH often lacks Debian's modules).
 * NULL when there is none; `why` says what is missing. */
static inline const char *te_python(char *why, size_t size) {
    static const char *const cands[] = {"python3", "/usr/bin/python3"};
    if (system("command -v protoc >/dev/null 2>&1") != 0) {
        snprintf(why, size, "protoc is not installed (apt-get install protobuf-compiler)");
        return NULL;
    }
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "%s -c 'import google.protobuf, crcmod' "
                 ">/dev/null 2>&1", cands[i]);
        if (system(cmd) == 0)
            return cands[i];
    }
    snprintf(why, size, "no python3 with google.protobuf and crcmod "
             "(apt-get install python3-protobuf python3-crcmod)");
    return NULL;
}

/* Run the checker on logdir with `flags`; its exit status (77: skip), its
 * output in out. */
static inline int te_check(const char *python, const char *logdir,
                           const char *flags, char *out, size_t size) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s %s %s 2>&1", python, TE_CHECKER, logdir, flags);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(out, size, "popen failed");
        return -1;
    }
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
