/* towerpack tests: helpers of the fault-injection suites (test_proc_fault_*):
 * run a program with a bound on its life, read a file, list a process's
 * children, read a process's RSS, load a checkpoint into a fresh model. */
#ifndef TP_FAULT_UTIL_H
#define TP_FAULT_UTIL_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <towerpack/checkpoint.h>
#include <towerpack/model_callbacks.h>
#include <towerpack/models.h>
#include <towerpack/optim.h>
#include <towerpack/towerpack.h>
#include "proc_testutil.h"

/* Start argv[0] with argv; stdout and stderr go to `out`. TMPDIR is set to
 * tmpdir (so private run dirs of the dataflows land where the test looks)
 * and, when fsize > 0, RLIMIT_FSIZE to fsize bytes with SIGXFSZ ignored
 * (writes past it fail with EFBIG instead of killing the process). */
static inline int fu_spawn(char *const argv[], const char *out, const char *tmpdir,
                           long fsize) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "TMPDIR=%s", tmpdir ? tmpdir : "");
    const char *env[] = {"TP_LOG_LEVEL=info", tmpdir ? tmp : NULL, NULL};
    pu_spawn_opts_t o = {.out = out, .env = env, .fsize = fsize};
    return pu_spawn(argv, &o);
}

/* Wait up to ms for the exit of pid; its status, or -1 (then it was
 * SIGKILLed: a hang). */
static inline int fu_wait(int pid, int ms) { return pu_waitpid(pid, ms); }

/* The next datapoint of a remote dataflow whose timeout is short, from a
 * sender that is alive: the short timeout is for the silence after a kill;
 * while the sender is still starting (exec, ASan, a loaded machine) its
 * timeouts say nothing, so wait for the event itself: a datapoint, or the
 * sender's end. 60 s guard against a hang. */
static inline tp_status_t fu_next_from(tp_dataflow_t *df, tp_datapoint_t **dp, int sender) {
    double t0 = tp_now_s();
    tp_status_t rc;
    while ((rc = tp_dataflow_next(df, dp)) == TP_ERR_TIMEOUT && !pu_gone(sender) &&
           tp_now_s() - t0 < 60)
        ;
    if (rc == TP_ERR_TIMEOUT)
        cr_log_error("no datapoint from sender %d (%s) in %.1f s", sender,
                     pu_gone(sender) ? "it is gone" : "alive", tp_now_s() - t0);
    return rc;
}

/* Wait up to ms for path to exist; 1 if it does. */
static inline int fu_wait_file(const char *path, int ms) {
    for (int i = 0; i <= ms / 10; i++) {
        if (access(path, F_OK) == 0)
            return 1;
        usleep(10000);
    }
    return access(path, F_OK) == 0;
}

/* The whole of a (small) file as a string in buf; "" when unreadable. */
static inline const char *fu_slurp(const char *path, char *buf, size_t size) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The children of pid (from /proc/PID/task/PID/children) into out[0..n);
 * returns how many. */
static inline int fu_children(int pid, int *out, int n) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", pid, pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int k = 0, c;
    while (k < n && fscanf(f, "%d", &c) == 1)
        out[k++] = c;
    fclose(f);
    return k;
}

/* Every descendant of pid (children, their children, ...: forked dataflow
 * workers sit under their zygote) into out[0..n); returns how many. */
static inline int fu_descendants(int pid, int *out, int n) {
    int k = fu_children(pid, out, n);
    for (int i = 0; i < k; i++)  /* k grows as grandchildren join */
        k += fu_children(out[i], out + k, n - k);
    return k;
}

/* Resident memory of pid in KiB, -1 when gone. */
static inline long fu_rss_kib(int pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

static tp_optimizer_t *fu_opt(void *user) {
    (void)user;
    return tp_optimizer_sgd(0.05, 0.9, 0);
}

/* Load checkpoint `path` strictly into a fresh zoo model `name`; TP_OK and
 * its global step in *step, or the loader's error. */
static inline tp_status_t fu_load(const char *name, const char *path, int64_t *step) {
    tp_input_desc_t inputs[2];
    memcpy(inputs, tp_zoo_inputs(), sizeof inputs);
    tp_model_desc_t desc = {inputs, 2, tp_zoo_find(name)->build, fu_opt, NULL};
    tp_model_config_t mc = tp_model_config_default();
    tp_model_t *m = tp_model_new(&desc, &mc);
    if (!m)
        return TP_ERR_NOMEM;
    tp_train_state_t st;
    tp_status_t rc = tp_checkpoint_load(m, path, TP_LOAD_STRICT, &st);
    if (rc == TP_OK && step)
        *step = st.global_step;
    tp_model_destroy(&m);
    return rc;
}

/* rm -rf dir */
static inline void fu_rmrf(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

#endif
