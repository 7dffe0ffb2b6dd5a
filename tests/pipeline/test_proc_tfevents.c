/* towerpack tests: a tp-train killed with SIGKILL in the middle of a run
 * leaves an event file whose complete records all read (at most one
 * partial record at its end), and the file grew while the run was alive
 * (flushed every few seconds, not only at exit). The checker itself is
 * checked too: a truncated tail passes only with --partial-tail-ok, a
 * flipped byte in a complete record never. Own executable: it forks and
 * execs tp-train. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "proc_testutil.h"
#include "tfevents_testutil.h"

/* The path of the one event file in dir ("" if none yet). */
static void s_find(const char *dir, char *path, size_t size) {
    path[0] = '\0';
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20))
            snprintf(path, size, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
}

static long s_size(const char *path) {
    struct stat st;
    return path[0] && stat(path, &st) == 0 ? (long)st.st_size : -1;
}

Test(proc_tfevents, sigkill_mid_run_leaves_whole_records, .timeout = 240) {
    char why[256];
    const char *py = te_python(why, sizeof why);
    if (!py)
        cr_skip_test("cannot read event files here: %s", why);
    char dir[] = "/tmp/tp-tfkill-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run", dir);
    char *argv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp",
                    "--epochs", "1000", "--steps-per-epoch", "50", "--threads", "1",
                    "--towers", "1", "--stats", "off",
                    "--test-spec", "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1",
                    "--logdir", logdir, NULL};
    const char *env[] = {"TP_LOG_LEVEL=warn", NULL};
    pu_spawn_opts_t o = {.out = "/dev/null", .env = env};
    pid_t pid = pu_spawn(argv, &o);
    cr_assert_gt(pid, 0);
    /* The file appears at the start (file_version, hparams); it must then
     * grow while the run is alive: the per-step learning rate flushed
     * every 2 s, and epoch ends. Kill it after it grew twice. */
    char path[512] = "";
    long first = -1, grown = 0, last = -1;
    for (int i = 0; i < 1200 && grown < 2; i++) {
        if (!path[0])
            s_find(logdir, path, sizeof path);
        long sz = s_size(path);
        if (first < 0 && sz > 0)
            first = last = sz;
        else if (sz > last) {
            grown++;
            last = sz;
        }
        if (pu_gone(pid))
            break;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "tp-train ended before it was killed (status %d)", status);
    cr_assert(path[0], "no event file in %s", logdir);
    cr_assert_eq(grown, 2, "the event file did not grow while tp-train ran "
                 "(%ld bytes at the start, %ld at the end)", first, last);

    char out[8192];
    int rc = te_check(py, logdir, "--partial-tail-ok --hparams", out, sizeof out);
    if (rc == 77)
        cr_skip_test("%s", out);
    cr_assert_eq(rc, 0, "check_tfevents.py after SIGKILL:\n%s", out);

    /* The checker tells a partial tail from a corrupt record. */
    char copy[256], cmd[1024];
    snprintf(copy, sizeof copy, "%s/copy", dir);
    cr_assert_eq(mkdir(copy, 0755), 0);
    snprintf(cmd, sizeof cmd, "head -c %ld %s > %s/events.out.tfevents.0.copy",
             s_size(path) - 5, path, copy);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(te_check(py, copy, "--partial-tail-ok", out, sizeof out), 0, "%s", out);
    cr_assert_eq(te_check(py, copy, "", out, sizeof out), 1, "%s", out);
    /* one byte of the second record's data (after the first record),
     * inverted: writing a fixed value changed nothing when the byte
     * already had it (the record's wall time: 1 run in 256 passed) */
    snprintf(cmd, sizeof cmd, "%s/events.out.tfevents.0.copy", copy);
    FILE *f = fopen(cmd, "r+b");
    cr_assert_not_null(f, "%s", cmd);
    cr_assert_eq(fseek(f, 40 + 12 + 3, SEEK_SET), 0);
    int byte = fgetc(f);
    cr_assert_neq(byte, EOF);
    cr_assert_eq(fseek(f, 40 + 12 + 3, SEEK_SET), 0);
    cr_assert_neq(fputc(~byte & 0xff, f), EOF);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(te_check(py, copy, "--partial-tail-ok", out, sizeof out), 1,
                 "a corrupt complete record passed: %s", out);
    cr_assert(strstr(out, "CRC"), "%s", out);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}
