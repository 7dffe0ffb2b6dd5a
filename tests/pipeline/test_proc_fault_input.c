/* towerpack fault injection: the trainer's input. A dataflow that fails
 * inside the prefetch actor (QueueInput) ends training with its error, not
 * a wait; a short soak (tp-soak through scripts/soak.sh: multi-process and
 * remote dataflow into training) loses and repeats nothing and its
 * trainer ends promptly. Own executable: it forks (the soak script). */
#include <time.h>
#include "actor_testutil.h"
#include "fault_util.h"

/* Must hold: when the training dataflow fails at its first datapoint,
 * tp_launch_train_with_config returns within 5 s with an error that names
 * the dataflow's failure (before: the trainer waited forever for a
 * prefetch actor that had ended), the input named once. With two towers
 * the batches are taken by StagingInput's threads, which learn of the
 * failure the same way. */
static void s_failing_dataflow(int towers) {
    tp_input_desc_t inputs[2];
    memcpy(inputs, tp_zoo_inputs(), sizeof inputs);
    tp_model_desc_t desc = {inputs, 2, tp_zoo_find("mlp")->build, fu_opt, NULL};
    tp_train_config_t cfg;
    tp_train_config_init(&cfg);
    cfg.model = &desc;
    cfg.dataflow = tu_count_df(100, 0, 0);  /* fails at index 0 */
    cfg.batch = 8;
    cfg.towers = towers;
    cfg.threads = 1;
    cfg.max_epoch = 1;
    cfg.steps_per_epoch = 10;
    cfg.default_callbacks = 0;
    cfg.stats = "off";
    double t0 = tp_now_s();
    tp_status_t rc = tp_launch_train_with_config(&cfg, NULL);
    cr_assert_lt(rc, 0);
    cr_assert_lt(tp_now_s() - t0, 5.0, "took %.1f s", tp_now_s() - t0);
    cr_assert(strstr(tp_last_error(), "QueueInput"), "%s", tp_last_error());
    /* said once: the actor's reason does not carry the name q_next adds */
    cr_assert(!strstr(tp_last_error(), "QueueInput: QueueInput"), "%s", tp_last_error());
    cr_assert(strstr(tp_last_error(), "planted failure"),
              "the dataflow's own message: %s", tp_last_error());
}

Test(fault_input, failing_dataflow_ends_training, .timeout = 120) {
    s_failing_dataflow(1);
}

Test(fault_input, failing_dataflow_ends_training_two_towers, .timeout = 120) {
    s_failing_dataflow(2);
}

/* Must hold: 100k datapoints from 2 senders (2 forked workers each) over
 * tcp into a training run arrive complete, in order per stream, none
 * twice; every batch is trained; the whole run ends within 60 s (the
 * trainer does not hang on its input at the end). */
Test(fault_input, short_soak, .timeout = 120) {
    /* Under a sanitizer RSS is not the program's: ASan keeps freed memory
     * in its quarantine. The datapoint checks still hold there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    const char *judge = "0";
#else
    const char *judge = "1";
#endif
    char cmd[1024], out[64];
    snprintf(out, sizeof out, "/tmp/tp-soak-test-XXXXXX");
    cr_assert_not_null(mkdtemp(out));
    snprintf(cmd, sizeof cmd,
             "BUILD=%s TOTAL=100000 INTERVAL=0.2 RSS_JUDGE=%s OUT=%s bash "
             "%s/scripts/soak.sh > %s/log.txt 2>&1", TP_BINARY_DIR, judge, out,
             TP_SOURCE_DIR, out);
    double t0 = tp_now_s();
    int st = system(cmd);
    double dt = tp_now_s() - t0;
    char log[300], buf[1 << 14];
    snprintf(log, sizeof log, "%s/log.txt", out);
    fu_slurp(log, buf, sizeof buf);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "soak failed:\n%s", buf);
    cr_assert(strstr(buf, "\"gaps\":0") && strstr(buf, "\"repeats\":0") &&
              strstr(buf, "soak: OK"), "%s", buf);
    cr_assert_lt(dt, 60.0, "soak took %.0f s", dt);
    fu_rmrf(out);
}
