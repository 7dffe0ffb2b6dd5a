/* towerpack tests: the pipeline spec names this module adds, the source
 * remote:ENDPOINT[,...] and the stage `processes N`, and tp-worker --spec.
 * They need the spec parser of dataflow/; without it they skip. */
#include <criterion/criterion.h>
#include "actor_testutil.h"
#include "proc_testutil.h"
#if __has_include(<towerpack/dataflow_spec.h>)
#include <towerpack/dataflow_spec.h>
#define HAVE_SPEC 1
#endif

#ifdef HAVE_SPEC
Test(proc_spec, processes_stage) {
    cr_assert_eq(tp_actor_spec_register(), TP_OK, "%s", tp_last_error());
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse("fake:size=40 | processes 2", &df), TP_OK, "%s",
                 tp_last_error());
    /* The stage keeps the fork rule; Criterion's own thread is known. */
    tp_dataflow_t *bad = NULL;
    cr_assert_eq(tp_spec_parse("fake:size=40 | processes 0", &bad), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "worker count"), "%s", tp_last_error());
    cr_assert_eq(tp_spec_parse("fake:size=40 | processes 2 turbo", &bad), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "turbo"), "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_size(df), 40);
    tp_dataflow_destroy(&df);
}

Test(proc_spec, remote_source_with_tp_worker_spec) {
    cr_assert_eq(tp_actor_spec_register(), TP_OK);
    char dir[64], spec[160], ep[128];
    tu_tmpdir(dir, sizeof dir);
    snprintf(ep, sizeof ep, "ipc://%s/s.sock", dir);
    snprintf(spec, sizeof spec, "remote:%s | batch 10", ep);
    tp_dataflow_t *df = NULL;
    cr_assert_eq(tp_spec_parse(spec, &df), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec", "fake:size=20",
                     "--connect", ep, "--count", "30", NULL};
    pid_t pid = pu_spawn(wargv, NULL);
    for (int i = 0; i < 3; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tp_datapoint_cget(dp, 0)->shape[0], 10);
        tp_datapoint_destroy(&dp);
    }
    int st = pu_waitpid(pid, 5000);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-worker status %d", st);
    tp_dataflow_destroy(&df);
    cr_assert_eq(pu_dir_entries(dir), 0);
    rmdir(dir);
    cr_assert_eq(tp_spec_parse("remote:http://x", &df), TP_ERR_INVALID);
    cr_assert(strstr(tp_last_error(), "http://x"), "%s", tp_last_error());
}
#else
Test(proc_spec, needs_the_spec_parser) {
    cr_assert_eq(tp_actor_spec_register(), TP_ERR_UNSUPPORTED);
    cr_skip_test("no pipeline spec parser in this build");
}
#endif
