/* towerpack tests: tp-worker and tp-top as programs. A plugin
 * (examples/worker_plugin.c, compiled here with cc) feeds tp-worker, a
 * remote dataflow receives; tp-top --once --json reads tp-worker's stats;
 * SIGINT ends tp-worker cleanly; bad arguments are clear errors. */
#include <criterion/criterion.h>
#include <jansson.h>
#include "actor_testutil.h"
#include "fault_util.h"
#include "proc_testutil.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

static char s_dir[64];
static char s_plugin[128];

static void setup(void) {
    tu_tmpdir(s_dir, sizeof s_dir);
    snprintf(s_plugin, sizeof s_plugin, "%s/libcount.so", s_dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cc -shared -fPIC -I%s/include -I%s/include %s/examples/worker_plugin.c "
             "-o %s 2>&1", TP_SOURCE_DIR, TP_BINARY_DIR, TP_SOURCE_DIR, s_plugin);
    if (system(cmd) != 0)
        s_plugin[0] = '\0';
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", s_dir);
}

/* Start a program with argv; stdout to `out` (NULL: inherit). */
static int spawn(char *const argv[], const char *out) {
    pu_spawn_opts_t o = {.out = out, .keep_stderr = 1};
    return pu_spawn(argv, &o);
}

/* A receiver bound at ep with ro, started: the trainer's side. */
static tp_dataflow_t *s_receiver(const char *ep, const tp_remote_opts_t *ro) {
    tp_dataflow_t *df = tp_df_remote(ep, ro);
    cr_assert_eq(tp_dataflow_reset_state(df, 0, 0), TP_OK, "%s", tp_last_error());
    return df;
}

TestSuite(proc_worker, .init = setup, .fini = teardown);

Test(proc_worker, plugin_to_remote_and_sigint) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[128], stats[128];
    snprintf(ep, sizeof ep, "ipc://%s/data.sock", s_dir);
    snprintf(stats, sizeof stats, "ipc://%s/stats.sock", s_dir);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 5;
    tp_dataflow_t *df = s_receiver(ep, &ro);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "50", "--plugin-arg", "1000", "--connect", ep,
                     "--stats", stats, "--hwm", "10", NULL};
    int pid = spawn(wargv, NULL);
    /* The plugin's passes of 50 repeat: values cycle 0..49 in order. */
    for (int i = 0; i < 500; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tu_value(dp), i % 50);
        cr_assert_eq(tp_datapoint_cget(dp, 1)->nbytes, 1000);
        tp_datapoint_destroy(&dp);
    }
    /* tp-top reads tp-worker's statistics (it is blocked on us: hwm). */
    char json[128];
    snprintf(json, sizeof json, "%s/top.json", s_dir);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-top", "--connect", stats, "--once",
                     "--json", "--timeout", "5", NULL};
    int tpid = spawn(targv, json);
    /* Keep the worker moving while tp-top waits for a snapshot. */
    for (int i = 0; i < 200; i++) {
        tp_datapoint_t *dp;
        if (tp_dataflow_next(df, &dp) == TP_OK)
            tp_datapoint_destroy(&dp);
        usleep(10000);
        if (pu_gone(tpid))
            break;
    }
    int st = pu_waitpid(tpid, 5000);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-top status %d", st);
    json_error_t err;
    json_t *root = json_load_file(json, 0, &err);
    cr_assert(root, "tp-top printed JSON: %s", err.text);
    json_t *actors = json_object_get(root, "actors");
    cr_assert(json_is_array(actors) && json_array_size(actors) == 1);
    json_t *a = json_array_get(actors, 0);
    cr_assert_str_eq(json_string_value(json_object_get(a, "name")), "tp-worker");
    const char *keys[] = {"msgs_per_s", "mb_per_s", "queue_fill", "starved_pct", "blocked_pct"};
    for (int k = 0; k < 5; k++)
        cr_assert(json_is_number(json_object_get(a, keys[k])), "%s", keys[k]);
    json_decref(root);

    double t0 = tp_now_s();
    kill(pid, SIGINT);
    st = pu_waitpid(pid, 2000);
    cr_assert_lt(tp_now_s() - t0, 2.0);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-worker status %d", st);
    char path[160];
    snprintf(path, sizeof path, "%s/stats.sock", s_dir);
    cr_assert_neq(access(path, F_OK), 0, "stats socket removed");
    tp_dataflow_destroy(&df);
}

Test(proc_worker, count_ends_the_worker) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/d2.sock", s_dir);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 5;
    tp_dataflow_t *df = s_receiver(ep, &ro);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", "--connect", ep, "--count", "20", "--lz4", NULL};
    int pid = spawn(wargv, NULL);
    for (int i = 0; i < 20; i++) {
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        cr_assert_eq(tu_value(dp), i % 7);
        tp_datapoint_destroy(&dp);
    }
    int st = pu_waitpid(pid, 5000);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
    tp_dataflow_destroy(&df);
}

/* Issue 47: a tp-worker outlived its trainer and joined the next run on
 * the same port. With --exit-with-trainer=1 it ends (exit 0, saying why)
 * about a second after its receiver closed; with --no-exit-with-trainer
 * it still runs then. */
Test(proc_worker, a_worker_ends_when_its_trainer_is_gone) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[128], out[2][128], buf[8192];
    snprintf(ep, sizeof ep, "ipc://%s/d3.sock", s_dir);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 10;
    tp_dataflow_t *df = s_receiver(ep, &ro);
    int pid[2];
    for (int k = 0; k < 2; k++) {
        char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                         "--plugin-arg", "7", "--connect", ep, "--hwm", "5",
                         "--log-level", "info",  /* ctest runs at warn */
                         k ? "--no-exit-with-trainer" : "--exit-with-trainer=1", NULL};
        snprintf(out[k], sizeof out[k], "%s/w%d.txt", s_dir, k);
        pu_spawn_opts_t o = {.out = out[k]};
        pid[k] = pu_spawn(wargv, &o);
    }
    for (int i = 0; i < 40; i++) {  /* sending */
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(df, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    /* both connected (their logs say so): the 40 may all be one worker's,
     * and the other, slow to start, could still be in its handshake */
    for (int k = 0; k < 2; k++) {
        int up = 0;
        for (int t = 0; t < 200 && !up; t++) {
            fu_slurp(out[k], buf, sizeof buf);
            up = strstr(buf, "connected to a receiver") != NULL;
            if (!up)
                usleep(50000);
        }
        cr_assert(up, "worker %d never connected in 10 s:\n%s", k, buf);
    }
    usleep(300000);
    tp_dataflow_destroy(&df);  /* the trainer ends */
    int st = pu_waitpid(pid[0], 6000);
    int st1;
    int alive = waitpid(pid[1], &st1, WNOHANG) == 0;  /* pu_waitpid would kill it */
    kill(pid[1], SIGTERM);
    st1 = alive ? pu_waitpid(pid[1], 5000) : st1;
    fu_slurp(out[0], buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "--exit-with-trainer=1: not ended 6 s after its trainer (status %d):\n%s", st, buf);
    cr_assert(strstr(buf, "has been gone for 1 s (--exit-with-trainer)"), "%s", buf);
    cr_assert(alive, "--no-exit-with-trainer ended with its trainer");
    cr_assert(st1 >= 0 && WIFEXITED(st1) && WEXITSTATUS(st1) == 0, "status %d", st1);
}

/* A worker with `mode` (--connect, --bind) at ipc://DIR/NAME.sock and
 * no trainer at the other end, run for 12 s: it keeps waiting, as it
 * should (a worker may start first), says `said` (its %s: the endpoint)
 * once, and SIGTERM ends it. */
static void s_nobody_there(const char *mode, const char *name, const char *said_fmt) {
    char ep[128], out[128], buf[8192];
    snprintf(ep, sizeof ep, "ipc://%s/%s.sock", s_dir, name);
    snprintf(out, sizeof out, "%s/%s.txt", s_dir, name);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", (char *)mode, ep, "--log-level", "info", NULL};
    pu_spawn_opts_t o = {.out = out};
    int pid = pu_spawn(wargv, &o);
    int alive = !pu_wait_gone(pid, 12000);
    fu_slurp(out, buf, sizeof buf);
    kill(pid, SIGTERM);
    int st = pu_waitpid(pid, 5000);
    cr_assert(alive, "a %s worker with no receiver yet ended:\n%s", mode, buf);
    char said[512];
    snprintf(said, sizeof said, said_fmt, ep, ep);
    cr_assert(strstr(buf, said), "nothing said about the missing receiver:\n%s", buf);
    cr_assert(!strstr(strstr(buf, said) + strlen(said), "no receiver"),
              "said twice in 12 s:\n%s", buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "SIGTERM: status %d", st);
}

/* A worker connecting where nobody listens (a trainer not started, a
 * mistyped address) waited in silence: its log said only "sending
 * dataflow ... (connect)", like a worker at work. After 10 s it says that
 * no receiver is there, naming the endpoint, once. */
Test(proc_worker, a_worker_with_nobody_at_its_endpoint_says_so_and_waits) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    s_nobody_there("--connect", "nobody", "send: no receiver at %s after 10 s");
}

/* The same on the other side: a worker that binds (--bind) and that no
 * trainer connects to (one started without --remote, or pointed
 * elsewhere) waited in silence for ever, its first datapoint blocked on a
 * socket with no peer. After 10 s it says that no receiver has connected,
 * naming the endpoint and the trainer's flag, once. */
Test(proc_worker, a_bound_worker_that_nobody_connects_to_says_so_and_waits) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    s_nobody_there("--bind", "unheard",
                   "send: no receiver has connected to %s after 10 s (is the trainer started, "
                   "connecting to it with --remote %s");
}

/* Issue 47: a worker left from an earlier run joined the next run on the
 * same port. With job ids, the trainer of job B refuses the worker of job A
 * (its datapoints dropped and counted, a warning naming the worker and both
 * ids) and the worker ends (exit 1) naming both ids. */
Test(proc_worker, a_worker_of_another_job_is_refused_on_both_sides) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[128], out[128], log[128], buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/job.sock", s_dir);
    snprintf(out, sizeof out, "%s/worker.txt", s_dir);
    snprintf(log, sizeof log, "%s/trainer.log", s_dir);
    cr_assert_eq(tp_log_set_file(log), TP_OK);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 5;
    ro.job = "job-A";
    tp_dataflow_t *a = s_receiver(ep, &ro);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", "--connect", ep, "--hwm", "5",
                     "--job", "job-A", NULL};
    pu_spawn_opts_t o = {.out = out};
    int pid = pu_spawn(wargv, &o);
    for (int i = 0; i < 20; i++) {  /* its own job's trainer takes it */
        tp_datapoint_t *dp;
        cr_assert_eq(tp_dataflow_next(a, &dp), TP_OK, "%s", tp_last_error());
        tp_datapoint_destroy(&dp);
    }
    cr_assert_eq(tp_df_remote_refused(a), 0);
    tp_dataflow_destroy(&a);  /* the run ends; the next binds the port */
    ro.job = "job-B";
    ro.timeout_s = 3;
    tp_dataflow_t *b = s_receiver(ep, &ro);
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_dataflow_next(b, &dp);
    cr_assert_eq(rc, TP_ERR_TIMEOUT, "job B took a datapoint of job A's worker (%d)", rc);
    int st = pu_waitpid(pid, 5000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1,
              "the worker of job A did not end with 1 (status %d):\n%s", st, buf);
    cr_assert(strstr(buf, "it is job 'job-B', this sender was started for job 'job-A'"),
              "%s", buf);
    char desc[512];
    tp_df_remote_describe(b, desc, sizeof desc);
    tp_dataflow_destroy(&b);
    tp_log_set_file(NULL);
    fu_slurp(log, buf, sizeof buf);
    cr_assert(strstr(buf, "it was started for job 'job-A', this run is job 'job-B'"),
              "%s", buf);
    char who[64];
    snprintf(who, sizeof who, "refused tp-worker %d@", pid);
    cr_assert(strstr(buf, who), "the trainer's log names the worker:\n%s", buf);
    /* once: its handshake names it, so its first message does (a second
     * line, unnamed then named, was the datapoints before its report) */
    int lines = 0;
    for (const char *p = buf; (p = strstr(p, "remote: refused ")); p++)
        lines++;
    cr_assert_eq(lines, 1, "the refusal is logged %d times:\n%s", lines, buf);
}

/* A tcp listener on 127.0.0.1 (its endpoint in ep). With backlog 0 and
 * nothing accepted it holds one connection in its queue: a connect after
 * that one gets no answer, as from a host gone. */
static int s_listen_silent(int backlog, char *ep, size_t size) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);  /* not the workers' */
    cr_assert(l >= 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 &&
                  listen(l, backlog) == 0 && getsockname(l, (struct sockaddr *)&a, &al) == 0,
              "listen on 127.0.0.1: %s", strerror(errno));
    snprintf(ep, size, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return l;
}

/* A trainer that stops in the middle of a worker's handshake (a worker
 * slow to connect; under load in CI): the worker took the closed
 * connection for a refusal and ended with exit 1 blaming CURVE keys. It is
 * a receiver gone: --exit-with-trainer ends it (exit 0) saying so. The
 * "trainer" here is a bare socket that takes the connection, reads the
 * greeting's start, and goes; on ipc, or on tcp as "localhost" (the
 * worker checks every address the name has: ::1 too where it has it). */
static void s_trainer_stops_mid_handshake(int tcp) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char path[128], ep[140], out[128], buf[16384];
    snprintf(path, sizeof path, "%s/vanish.sock", s_dir);
    snprintf(out, sizeof out, "%s/vanish.txt", s_dir);
    int l;
    if (tcp) {
        l = s_listen_silent(4, ep, sizeof ep);
        char port[16];
        snprintf(port, sizeof port, "%s", strrchr(ep, ':') + 1);
        snprintf(ep, sizeof ep, "tcp://localhost:%s", port);
    } else {
        snprintf(ep, sizeof ep, "ipc://%s", path);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        cr_assert_lt(strlen(path), sizeof a.sun_path);
        memcpy(a.sun_path, path, strlen(path) + 1);
        l = socket(AF_UNIX, SOCK_STREAM, 0);
        cr_assert(l >= 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0,
                  "listen %s: %s", path, strerror(errno));
    }
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", "--connect", ep, "--exit-with-trainer=1",
                     "--log-level", "info", NULL};
    pu_spawn_opts_t o = {.out = out};
    int pid = pu_spawn(wargv, &o);
    struct pollfd pl = {l, POLLIN, 0};
    cr_assert_eq(poll(&pl, 1, 20000), 1, "the worker never connected");
    int c = accept(l, NULL, NULL);
    cr_assert(c >= 0);
    struct pollfd pc = {c, POLLIN, 0};
    char greeting[10];
    cr_assert(poll(&pc, 1, 10000) == 1 && read(c, greeting, sizeof greeting) > 0,
              "no greeting from the worker");
    /* gone: nobody listens at the endpoint when the worker learns of it */
    close(l);
    if (!tcp)
        unlink(path);
    close(c);
    int st = pu_waitpid(pid, 15000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "not ended (exit 0) by --exit-with-trainer=1 (status %d):\n%s", st, buf);
    cr_assert(strstr(buf, "is gone (a trainer that stopped): waiting for the next"), "%s", buf);
    cr_assert(strstr(buf, "has been gone for 1 s (--exit-with-trainer)"), "%s", buf);
    cr_assert(!strstr(buf, "CURVE"), "a trainer gone taken for a refusal:\n%s", buf);
}

Test(proc_worker, a_worker_whose_trainer_stops_mid_handshake_ends_as_gone) {
    s_trainer_stops_mid_handshake(0);
}

Test(proc_worker, a_tcp_worker_whose_trainer_stops_mid_handshake_ends_as_gone) {
    s_trainer_stops_mid_handshake(1);
}

/* Start a worker of 7-datapoint passes connecting to ep with
 * --exit-with-trainer=1, info logged to out, libzmq's handshake interval
 * `ivl` seconds (TP_SEND_HANDSHAKE_S: at 0.5 a handshake with no answer
 * fails after that, not after libzmq's 30 s); its pid. */
static int s_worker_on(const char *ep, const char *ivl, const char *out) {
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", "--connect", (char *)ep, "--exit-with-trainer=1",
                     "--log-level", "info", NULL};
    char env_ivl[64];
    snprintf(env_ivl, sizeof env_ivl, "TP_SEND_HANDSHAKE_S=%s", ivl);
    const char *env[] = {env_ivl, NULL};
    pu_spawn_opts_t o = {.out = out, .env = env};
    return pu_spawn(wargv, &o);
}

/* The three ways a handshake fails, as either sender says them: tp-worker
 * (s_worker_on) and the Python sender (s_python_on), whose lines start
 * with "tp_send: " (`pre`). `who` names the sender in the messages. */

/* A dead host (s_listen_silent(0), closed here): sender pid, started at t0
 * with a handshake of 0.5 s, ends (exit 0) as with a receiver gone, in
 * under `limit` s; its output (out) in buf. */
static void s_ends_as_gone(int pid, double t0, double limit, int l, const char *ep,
                           const char *out, const char *pre, char *buf, size_t size) {
    int st = pu_waitpid(pid, 20000);
    double took = tp_now_s() - t0;
    close(l);
    fu_slurp(out, buf, size);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "not ended (exit 0) by --exit-with-trainer=1 (status %d):\n%s", st, buf);
    char said[160];
    snprintf(said, sizeof said, "%sthe handshake with the receiver at %s failed and its "
             "host does not answer a connect", pre, ep);
    cr_assert(strstr(buf, said), "%s", buf);
    cr_assert(strstr(buf, "has been gone for 1 s (--exit-with-trainer)"), "%s", buf);
    cr_assert(!strstr(buf, "CURVE"), "a host gone taken for a refusal:\n%s", buf);
    cr_assert_lt(took, limit, "ended after %.1f s:\n%s", took, buf);
}

/* A live host that takes connections and never answers (s_listen_silent(64),
 * closed here): sender pid, with a handshake of 0.5 s, is alive after
 * `wait_ms` (more handshakes run out than made a refusal, 3, for longer
 * than --exit-with-trainer waits), has said so once, and took it for
 * neither a refusal nor a host gone; once the listener closes (the trainer
 * ends) it ends as with any trainer gone. */
static void s_waits_for_the_mute(int pid, int wait_ms, int l, const char *ep, const char *out,
                                 const char *pre, const char *who) {
    char buf[16384], end[16384];
    int alive = !pu_wait_gone(pid, wait_ms);
    fu_slurp(out, buf, sizeof buf);
    close(l);  /* the trainer ends */
    int st = pu_waitpid(pid, 15000);
    fu_slurp(out, end, sizeof end);
    cr_assert(alive, "a receiver that does not answer ended the %s:\n%s", who, buf);
    char said[256];
    snprintf(said, sizeof said, "%sthe receiver at %s is not answering the handshake (0.5 s: "
             "a trainer stopped or overloaded, or not a towerpack receiver): waiting for it",
             pre, ep);
    cr_assert(strstr(buf, said), "%s", buf);
    cr_assert(!strstr(strstr(buf, said) + 1, said), "said more than once:\n%s", buf);
    cr_assert(!strstr(buf, "does not answer a connect"), "a live host taken for one gone:\n%s",
              buf);
    cr_assert(!strstr(end, "CURVE"), "a receiver not answering taken for a refusal:\n%s", end);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "not ended (exit 0) by --exit-with-trainer=1 once the trainer ended (status "
              "%d):\n%s", st, end);
    cr_assert(strstr(end, "has been gone for 1 s (--exit-with-trainer)"), "%s", end);
}

/* A trainer's host that dies (or leaves the network) in the middle of a
 * worker's handshake: nothing closes the connection, the handshake runs
 * out, and the worker's own connect gets no answer. It took that for "it
 * cannot tell" and counted it toward a refusal. It is a receiver gone:
 * the worker says so, naming the endpoint, and --exit-with-trainer ends it
 * (exit 0) a second later. The dead host is a listener of backlog 0 that
 * never accepts: the worker's connection fills its queue, its greeting is
 * never answered, and every later connect gets no answer. */
Test(proc_worker, a_worker_whose_trainers_host_dies_mid_handshake_ends_as_gone) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[64], out[128], buf[16384];
    snprintf(out, sizeof out, "%s/deadhost.txt", s_dir);
    int l = s_listen_silent(0, ep, sizeof ep);
    double t0 = tp_now_s();
    /* the handshake 0.5 s, the probe 1.5 s, the wait 1 s: a start's worth more */
    s_ends_as_gone(s_worker_on(ep, "0.5", out), t0, 10.0, l, ep, out, "", buf, sizeof buf);
}

/* ... and a receiver alive that does not answer the handshake (a trainer
 * stopped in a debugger, swapping, overloaded) is not taken for one gone:
 * its host answers a connect (its kernel does, however slow the process).
 * Three such handshakes in a row were a refusal that blamed CURVE keys;
 * they are a receiver not answering, said once, and the worker waits for
 * it however long (--exit-with-trainer=1 does not end it: its host holds
 * each connection). When the trainer then ends (the listener closed), the
 * worker ends as with any trainer gone. */
Test(proc_worker, a_receiver_that_takes_connections_but_never_answers_is_not_gone) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[64], out[128];
    snprintf(out, sizeof out, "%s/mute.txt", s_dir);
    int l = s_listen_silent(64, ep, sizeof ep);
    s_waits_for_the_mute(s_worker_on(ep, "0.5", out), 4000, l, ep, out, "", "worker");
}

/* Plays a host still there that closes every handshake on the listening
 * socket l (after the sender's greeting) until sender pid ends or 20 s pass;
 * counts the handshakes closed in *closed, closes l, returns pid's status. */
static int s_close_handshakes(int l, int pid, int *closed) {
    int st = -1;
    for (double t0 = tp_now_s(); tp_now_s() - t0 < 20;) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            break;
        st = -1;
        struct pollfd pl = {l, POLLIN, 0};
        if (poll(&pl, 1, 50) != 1)
            continue;
        int c = accept(l, NULL, NULL);
        struct pollfd pc = {c, POLLIN, 0};
        char greeting[10];
        if (c >= 0 && poll(&pc, 1, 2000) == 1 && read(c, greeting, sizeof greeting) > 0)
            (*closed)++;
        if (c >= 0)
            close(c);
    }
    if (st == -1)
        st = pu_waitpid(pid, 1);
    close(l);
    return st;
}

/* Sender pid against a host that closes every handshake on l: it ends
 * (exit 1) as refused, a close told from a handshake run out; its output
 * (out) in buf. */
static void s_refused_by_the_closer(int pid, int l, const char *out, char *buf, size_t size) {
    int closed = 0, st = s_close_handshakes(l, pid, &closed);
    fu_slurp(out, buf, size);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1,
              "not ended (exit 1) as refused after %d handshakes closed (status %d):\n%s",
              closed, st, buf);
    cr_assert(strstr(buf, "or it is not a towerpack receiver"), "%s", buf);
    cr_assert(!strstr(buf, "not answering the handshake"), "a close taken for no answer:\n%s",
              buf);
}

/* A receiver still there that closes every handshake (no towerpack
 * receiver, or one that wants CURVE keys) is still a refusal after three:
 * a close is told from a handshake run out. */
Test(proc_worker, a_receiver_that_closes_every_handshake_is_a_refusal) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[64], out[128], buf[16384];
    snprintf(out, sizeof out, "%s/closer.txt", s_dir);
    int l = s_listen_silent(16, ep, sizeof ep);
    s_refused_by_the_closer(s_worker_on(ep, "5", out), l, out, buf, sizeof buf);
}

/* The same three handshakes for the Python sender (tools/tp-worker/
 * tp_send.py as a program: Fashion-MNIST batches until it ends), which
 * ignored a failed handshake: it waited for ever, silent, whatever the
 * receiver did. Start it connecting to ep with --exit-with-trainer=1 and
 * libzmq's handshake interval `ivl` (TP_SEND_HANDSHAKE_S), its output to
 * out; its pid. Skipped without numpy, pyzmq or the data. */
static int s_python_on(const char *ep, const char *ivl, const char *out) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("no Fashion-MNIST (dataset-fashion-mnist)");
    char *pargv[] = {"/usr/bin/python3", TP_SOURCE_DIR "/tools/tp-worker/tp_send.py",
                     "--connect", (char *)ep, "--exit-with-trainer=1", NULL};
    char env_ivl[64];
    snprintf(env_ivl, sizeof env_ivl, "TP_SEND_HANDSHAKE_S=%s", ivl);
    const char *env[] = {env_ivl, "TP_LOG_LEVEL=info", NULL};
    pu_spawn_opts_t o = {.out = out, .env = env};
    return pu_spawn(pargv, &o);
}

/* A dead host (a listener of backlog 0 that never accepts) ends the
 * Python sender as a receiver gone: said, then --exit-with-trainer. */
Test(proc_worker, a_python_sender_whose_trainers_host_dies_mid_handshake_ends_as_gone) {
    char ep[64], out[128], buf[16384];
    snprintf(out, sizeof out, "%s/pydead.txt", s_dir);
    int l = s_listen_silent(0, ep, sizeof ep);
    double t0 = tp_now_s();
    /* the handshake 0.5 s, the check 1.5 s, the wait 1 s, Python's start */
    s_ends_as_gone(s_python_on(ep, "0.5", out), t0, 12.0, l, ep, out, "tp_send: ", buf,
                   sizeof buf);
}

/* A live host that takes connections and never answers (a trainer
 * stopped) is no refusal and not gone: said once, waited for; once the
 * listener closes, the sender ends as with any trainer gone. */
Test(proc_worker, a_python_sender_waits_for_a_receiver_that_never_answers) {
    char ep[64], out[128];
    snprintf(out, sizeof out, "%s/pymute.txt", s_dir);
    int l = s_listen_silent(64, ep, sizeof ep);
    /* Python's start on top of the handshakes */
    s_waits_for_the_mute(s_python_on(ep, "0.5", out), 5000, l, ep, out, "tp_send: ", "sender");
}

/* A host still there that closes every handshake is a refusal (exit 1)
 * after three, naming the handshake, not a receiver not answering. */
Test(proc_worker, a_python_sender_whose_handshakes_are_closed_is_refused) {
    char ep[64], out[128], buf[16384];
    snprintf(out, sizeof out, "%s/pycloser.txt", s_dir);
    int l = s_listen_silent(16, ep, sizeof ep);
    s_refused_by_the_closer(s_python_on(ep, "5", out), l, out, buf, sizeof buf);
    char said[256];
    snprintf(said, sizeof said, "tp_send: the handshake with the receiver at %s failed: the "
             "receiver closed the connection in the handshake", ep);
    cr_assert(strstr(buf, said), "%s", buf);
}

/* A TP_SEND_HANDSHAKE_S that is not a number of seconds ends the Python
 * sender (exit 1) naming it, as it ends tp-worker. */
Test(proc_worker, a_python_senders_bad_handshake_interval_is_a_clear_error) {
    char ep[128], out[128], buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/pyhs.sock", s_dir);
    snprintf(out, sizeof out, "%s/pyhs.txt", s_dir);
    int st = pu_waitpid(s_python_on(ep, "soon", out), 20000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d:\n%s", st, buf);
    cr_assert(strstr(buf, "tp_send: TP_SEND_HANDSHAKE_S='soon' is not a number of seconds"),
              "%s", buf);
}

/* Nobody at a Python sender's endpoint (a trainer not started, a wrong
 * address): ZeroMQ's connect is asynchronous, and tp_send.py waited for its
 * first receiver in silence for ever. As a module it says so after
 * NO_RECEIVER_NOTE_S (10 s; 1 here), a warning of the tp_send logger that
 * shows without any logging set up, and with connect_timeout it raises
 * NoReceiverError (a TimeoutError) naming the endpoint once that time has
 * passed; as a program, --connect-timeout S ends it (exit 1) saying so. */
Test(proc_worker, a_python_sender_with_nobody_at_its_endpoint_says_so_and_can_time_out) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    char ep[128], code[1024], said[512];
    static char buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/pynobody.sock", s_dir);
    snprintf(code, sizeof code,
             "import sys; sys.path.insert(0, '%s/tools/tp-worker')\n"
             "import numpy as np, tp_send\n"
             "tp_send.NO_RECEIVER_NOTE_S = 1\n"
             "s = tp_send.Sender('%s', connect_timeout=3)\n"
             "try:\n"
             "    s.send([np.zeros((8, 28, 28), np.uint8), np.zeros(8, np.int32)])\n"
             "except tp_send.NoReceiverError as e:\n"
             "    assert isinstance(e, TimeoutError)\n"
             "    print(e, file=sys.stderr); s.close(); sys.exit(3)\n", TP_SOURCE_DIR, ep);
    char *pargv[] = {"/usr/bin/python3", "-c", code, NULL};
    double t0 = tp_now_s();
    int st = pu_run(pargv, NULL, buf, sizeof buf);
    double took = tp_now_s() - t0;
    cr_assert_eq(st, 3, "status %d:\n%s", st, buf);
    snprintf(said, sizeof said, "tp_send: no receiver at %s after 1 s (nothing there takes "
             "the connection: is the trainer started, binding it with --remote @%s", ep, ep);
    cr_assert(strstr(buf, said), "no warning after 1 s:\n%s", buf);
    cr_assert(!strstr(strstr(buf, said) + strlen(said), "after 2 s"), "said twice:\n%s", buf);
    snprintf(said, sizeof said, "tp_send: no receiver at %s after 3 s (", ep);
    cr_assert(strstr(buf, said), "no NoReceiverError naming the endpoint:\n%s", buf);
    cr_assert(took >= 3.0 && took < 20.0, "ended after %.1f s", took);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        return;  /* the program sends Fashion-MNIST */
    char *prog[] = {"/usr/bin/python3", TP_SOURCE_DIR "/tools/tp-worker/tp_send.py",
                    "--connect", ep, "--connect-timeout", "1", NULL};
    st = pu_run(prog, NULL, buf, sizeof buf);
    cr_assert_eq(st, 1, "status %d:\n%s", st, buf);
    snprintf(said, sizeof said, "tp_send: no receiver at %s after 1 s (", ep);
    cr_assert(strstr(buf, said) && strstr(buf, "(--connect-timeout)"), "%s", buf);
}

/* A Python sender that binds and that nobody connects to waited in silence
 * for ever in send(): it says so after NO_RECEIVER_NOTE_S (1 here), once,
 * naming the endpoint and the trainer's flag, and waits on (a bound
 * sender's wait has no connect_timeout: a sender that binds is there to be
 * found); the test stops it after 3 s. */
Test(proc_worker, a_bound_python_sender_that_nobody_connects_to_says_so) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    char ep[128], code[1024], said[512];
    static char buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/pyunheard.sock", s_dir);
    snprintf(code, sizeof code,
             "import os, sys, signal; sys.path.insert(0, '%s/tools/tp-worker')\n"
             "import numpy as np, tp_send\n"
             "tp_send.NO_RECEIVER_NOTE_S = 1\n"
             "s = tp_send.Sender('%s', bind=True)\n"
             "signal.signal(signal.SIGALRM, lambda *a: (sys.stderr.flush(), os._exit(3)))\n"
             "signal.alarm(3)\n"
             "s.send([np.zeros((8, 28, 28), np.uint8), np.zeros(8, np.int32)])\n",
             TP_SOURCE_DIR, ep);
    char *pargv[] = {"/usr/bin/python3", "-c", code, NULL};
    int st = pu_run(pargv, NULL, buf, sizeof buf);
    cr_assert_eq(st, 3, "status %d (3: still waiting after 3 s):\n%s", st, buf);
    snprintf(said, sizeof said, "tp_send: no receiver has connected to %s after 1 s (is the "
             "trainer started, connecting to it with --remote %s", ep, ep);
    cr_assert(strstr(buf, said), "no warning after 1 s:\n%s", buf);
    cr_assert(!strstr(strstr(buf, said) + strlen(said), "no receiver"), "said twice:\n%s",
              buf);
}

/* An endpoint the Python sender cannot use is a ValueError naming it (the
 * program prints it and exits 1): it was pyzmq's traceback ending in
 * "zmq.error.ZMQError: Invalid argument" for "foo", or "Cannot assign
 * requested address" without the endpoint for a bind. */
Test(proc_worker, a_python_senders_bad_endpoint_is_a_clear_error) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    char code[1024];
    static char buf[16384];
    snprintf(code, sizeof code,
             "import sys; sys.path.insert(0, '%s/tools/tp-worker')\n"
             "import tp_send\n"
             "for ep, bind in (('foo', False), ('tcp://192.0.2.1:5555', True)):\n"
             "    try:\n"
             "        tp_send.Sender(ep, bind=bind).close()\n"
             "    except ValueError as e:\n"
             "        print(e)\n", TP_SOURCE_DIR);
    char *pargv[] = {"/usr/bin/python3", "-c", code, NULL};
    int st = pu_run(pargv, NULL, buf, sizeof buf);
    cr_assert_eq(st, 0, "status %d:\n%s", st, buf);
    cr_assert(strstr(buf, "tp_send: endpoint 'foo' is not tcp://HOST:PORT or ipc://PATH\n") &&
                  strstr(buf, "tp_send: bind tcp://192.0.2.1:5555: Cannot assign requested "
                              "address\n"), "%s", buf);
}

/* TP_SEND_HANDSHAKE_S that is not a number of seconds ends the worker
 * (exit 1) naming the variable and its value. */
Test(proc_worker, a_bad_handshake_interval_is_a_clear_error) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    char ep[128], out[128], buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/hs.sock", s_dir);
    snprintf(out, sizeof out, "%s/hs.txt", s_dir);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", "--connect", ep, NULL};
    const char *env[] = {"TP_SEND_HANDSHAKE_S=soon", NULL};
    pu_spawn_opts_t o = {.out = out, .env = env};
    int st = pu_waitpid(pu_spawn(wargv, &o), 10000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d:\n%s", st, buf);
    cr_assert(strstr(buf, "TP_SEND_HANDSHAKE_S='soon' is not a number of seconds"), "%s", buf);
}

/* The same with CURVE (the docs' advice off a trusted network): the worker
 * reads the trainer's job id with a CURVE handshake of its own, made with
 * the run's client keys, and ends naming both ids. */
Test(proc_worker, a_curve_worker_of_another_job_ends_naming_both) {
    if (!s_plugin[0])
        cr_skip_test("no C compiler to build the example plugin");
    if (!tp_curve_available())
        cr_skip_test("this libzmq has no CURVE");
    char ep[128], keys[128], out[128], buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/curvejob.sock", s_dir);
    snprintf(keys, sizeof keys, "%s/keys", s_dir);
    snprintf(out, sizeof out, "%s/cworker.txt", s_dir);
    cr_assert_eq(tp_curve_keygen(keys), TP_OK, "%s", tp_last_error());
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.curve_dir = keys;
    ro.job = "job-B";
    tp_dataflow_t *b = s_receiver(ep, &ro);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", s_plugin,
                     "--plugin-arg", "7", "--connect", ep, "--curve", keys,
                     "--job", "job-A", NULL};
    pu_spawn_opts_t o = {.out = out};
    int pid = pu_spawn(wargv, &o);
    int st = pu_waitpid(pid, 10000);
    fu_slurp(out, buf, sizeof buf);
    tp_dataflow_destroy(&b);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1,
              "the CURVE worker of job A did not end with 1 (status %d):\n%s", st, buf);
    cr_assert(strstr(buf, "it is job 'job-B', this sender was started for job 'job-A'"),
              "%s", buf);
}

/* Issue 47: a Python sender that needs no tensorpack (tools/tp-worker/
 * tp_send.py: numpy and pyzmq) feeds tp-train --remote in the wire format;
 * the trainer's log names it as it names a tp-worker, and five steps train.
 * Against a receiver of another job it ends (exit 1) naming both ids.
 * Skipped without Debian's python3-numpy and python3-zmq or the data. */
Test(proc_worker, a_python_sender_trains_tp_train) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("no Fashion-MNIST (dataset-fashion-mnist)");
    char ep[128], bind[140], logdir[128], out[128], pyout[128], olog[128], buf[65536];
    snprintf(ep, sizeof ep, "ipc://%s/py.sock", s_dir);
    snprintf(olog, sizeof olog, "%s/other.log", s_dir);
    snprintf(bind, sizeof bind, "@%s", ep);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    snprintf(out, sizeof out, "%s/train.txt", s_dir);
    snprintf(pyout, sizeof pyout, "%s/py.txt", s_dir);
    char *pargv[] = {"/usr/bin/python3", TP_SOURCE_DIR "/tools/tp-worker/tp_send.py",
                     "--connect", ep, "--batch", "64", "--count", "20", "--job", "run-py",
                     NULL};
    pu_spawn_opts_t po = {.out = pyout};
    /* first a receiver of another job: the sender reads its id and ends */
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.job = "run-other";
    ro.timeout_s = 0.2;  /* each next() below: its refusals, then a timeout */
    cr_assert_eq(tp_log_set_file(olog), TP_OK);
    tp_dataflow_t *other = s_receiver(ep, &ro);
    char *endless[] = {"/usr/bin/python3", TP_SOURCE_DIR "/tools/tp-worker/tp_send.py",
                       "--connect", ep, "--batch", "64", "--job", "run-py", NULL};
    int py = pu_spawn(endless, &po);
    /* the receiver reads while the sender finds out (its messages are
     * refused, named by its handshake's X-Tp-Sender) */
    int pst = -1;
    for (int t = 0; t < 100 && waitpid(py, &pst, WNOHANG) == 0; t++) {
        tp_datapoint_t *dp = NULL;
        tp_status_t rc = tp_dataflow_next(other, &dp);
        cr_assert_neq(rc, TP_OK, "job run-other took a datapoint of job run-py");
        pst = -1;
    }
    if (pst == -1)
        pst = pu_waitpid(py, 1000);
    tp_dataflow_destroy(&other);
    tp_log_set_file(NULL);
    fu_slurp(pyout, buf, sizeof buf);
    cr_assert(pst >= 0 && WIFEXITED(pst) && WEXITSTATUS(pst) == 1,
              "tp_send.py against another job: status %d:\n%s", pst, buf);
    cr_assert(strstr(buf, "it is job 'run-other', this sender was started for job 'run-py'"),
              "%s", buf);
    fu_slurp(olog, buf, sizeof buf);
    char pyname[64];
    snprintf(pyname, sizeof pyname, "remote: refused tp_send.py %d@", py);
    const char *named = strstr(buf, pyname);
    cr_assert(named && !strstr(named + 1, "remote: refused "),
              "the receiver names the Python sender once:\n%s", buf);
    unlink(pyout);
    py = pu_spawn(pargv, &po);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                     "--steps-per-epoch", "5", "--batch", "64", "--remote", bind,
                     "--job", "run-py", "--threads", "1", "--towers", "1", "--test-spec",
                     "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1",
                     "--logdir", logdir, "--no-tensorboard", NULL};
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    pu_spawn_opts_t to = {.out = out, .env = env};
    int tr = pu_spawn(targv, &to);
    int st = pu_waitpid(tr, 120000);
    pst = pu_waitpid(py, 10000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-train status %d:\n%s",
              st, buf);
    char who[64];
    snprintf(who, sizeof who, "remote: tp_send.py %d@", py);
    cr_assert(strstr(buf, who), "the trainer's log names the Python sender:\n%s", buf);
    char where[200];  /* and where it connected (its report's eleventh field) */
    snprintf(where, sizeof where, "(connected to %s) joined", ep);
    cr_assert(strstr(strstr(buf, who), where), "no '%s':\n%s", where, buf);
    cr_assert(strstr(buf, "ZMQInput/unfit: 0"), "%s", buf);
    cr_assert(!strstr(buf, "dropped a malformed"), "%s", buf);
    cr_assert(strstr(buf, "test accuracy"), "%s", buf);
    fu_slurp(pyout, buf, sizeof buf);
    cr_assert(pst >= 0 && WIFEXITED(pst) && WEXITSTATUS(pst) == 0, "tp_send.py status %d:\n%s",
              pst, buf);
}

/* A remote dataflow bound at ep that takes Fashion-MNIST batches of
 * `batch` (image uint8[batch,28,28], label int32[batch]) and gives unfit
 * senders a grace of 1 s; this process logs to `log` (the caller sets
 * tp_log_set_file(NULL) back). */
static tp_dataflow_t *s_fmnist_receiver(const char *ep, const char *log, int64_t batch,
                                        int64_t classes) {
    cr_assert_eq(tp_log_set_file(log), TP_OK);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 30;
    ro.unfit_grace_s = 1;
    tp_dataflow_t *r = tp_df_remote(ep, &ro);
    tp_remote_expect_t want[2] = {{"image", TP_UINT8, 3, {batch, 28, 28}, 0},
                                  {"label", TP_INT32, 1, {batch}, classes}};
    cr_assert_eq(tp_df_remote_expect(r, want, 2), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(r, 0, 0), TP_OK, "%s", tp_last_error());
    return r;
}

/* The Python sender pargv (its output to pyout) against the receiver r
 * (logging to `log`; destroyed here): the sender ends (exit 1) before
 * sending a batch, saying `why` (and `pysays`, NULL: nothing more); the
 * receiver's next() ends (TP_ERR_SHAPE) with nothing of it taken, and its
 * log names tp_send.py and the same mismatch. */
static void s_python_sender_refused(tp_dataflow_t *r, char *const pargv[], const char *pyout,
                                    const char *log, const char *why, const char *pysays) {
    char buf[16384];
    pu_spawn_opts_t po = {.out = pyout};
    int py = pu_spawn(pargv, &po);
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_dataflow_next(r, &dp);
    int pst = pu_waitpid(py, 20000);
    uint64_t unfit = tp_df_remote_unfit(r);
    tp_dataflow_destroy(&r);
    tp_log_set_file(NULL);
    fu_slurp(pyout, buf, sizeof buf);
    cr_assert(pst >= 0 && WIFEXITED(pst) && WEXITSTATUS(pst) == 1 && strstr(buf, why) &&
                  strstr(buf, "does not take this sender's datapoints") &&
                  (!pysays || strstr(buf, pysays)),
              "tp_send.py (status %d):\n%s", pst, buf);
    cr_assert_eq(rc, TP_ERR_SHAPE, "%d %s", rc, tp_last_error());
    cr_assert_eq(unfit, 0, "the sender sent %llu batches that do not fit",
                 (unsigned long long)unfit);
    fu_slurp(log, buf, sizeof buf);
    char who[64];
    snprintf(who, sizeof who, "tp_send.py %d@", py);
    cr_assert(strstr(buf, who) && strstr(buf, why), "the receiver's log (%s):\n%s", who, buf);
}

/* The component handshake in the Python sender: tp_send.py of batch 32
 * against a receiver that takes batches of 64 ends (exit 1) before sending
 * any, naming both sides, and the receiver's log names it. */
Test(proc_worker, a_python_sender_of_another_batch_ends_naming_both_sides) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("no Fashion-MNIST (dataset-fashion-mnist)");
    char ep[128], pyout[128], log[128];
    snprintf(ep, sizeof ep, "ipc://%s/pycomps.sock", s_dir);
    snprintf(pyout, sizeof pyout, "%s/pycomps.txt", s_dir);
    snprintf(log, sizeof log, "%s/pycomps.log", s_dir);
    tp_dataflow_t *r = s_fmnist_receiver(ep, log, 64, 0);
    char *pargv[] = {"/usr/bin/python3", TP_SOURCE_DIR "/tools/tp-worker/tp_send.py",
                     "--connect", ep, "--batch", "32", NULL};
    s_python_sender_refused(r, pargv, pyout, log,
                            "component 0 'image' is uint8[32,28,28], expected uint8[64,28,28]",
                            NULL);
}

/* Issue 47, the component handshake: a tp-worker whose datapoints do not
 * fit what the receiver takes (its components, given by the trainer's
 * model and carried in the handshake) ends at once (exit 1) naming the
 * receiver, the component, what is expected and what it sends; the
 * receiver's log names the worker and the same mismatch, and its next()
 * ends (TP_ERR_SHAPE) once no fitting sender is left, nothing hangs. One
 * case each: the wrong dtype, the wrong shape, a missing component. */
static void s_unfit_case(const char *spec, const char *why, int64_t classes,
                         const char *tail) {
    char ep[128], out[128], log[128], buf[16384];
    snprintf(ep, sizeof ep, "ipc://%s/comps.sock", s_dir);
    snprintf(out, sizeof out, "%s/cworker.txt", s_dir);
    snprintf(log, sizeof log, "%s/ctrainer.log", s_dir);
    unlink(out);
    unlink(log);
    tp_dataflow_t *r = s_fmnist_receiver(ep, log, 8, classes);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec", (char *)spec, "--connect", ep,
                     NULL};
    pu_spawn_opts_t o = {.out = out};
    int pid = pu_spawn(wargv, &o);
    double t0 = tp_now_s();
    tp_datapoint_t *dp = NULL;
    tp_status_t rc = tp_dataflow_next(r, &dp);
    double waited = tp_now_s() - t0;
    char err[1024];
    snprintf(err, sizeof err, "%s", tp_last_error());
    int st = pu_waitpid(pid, 10000);
    tp_dataflow_destroy(&r);
    tp_log_set_file(NULL);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 1,
              "the worker did not end with 1 (status %d):\n%s", st, buf);
    char want_worker[512];
    snprintf(want_worker, sizeof want_worker, "the receiver at %s does not take this "
             "sender's datapoints: %s", ep, why);
    cr_assert(strstr(buf, want_worker), "the worker's message (%s):\n%s", want_worker, buf);
    cr_assert(strstr(buf, "(it takes image:uint8[8,28,28];label:int32[8]") &&
                  (!tail || strstr(buf, tail)),
              "the worker's message (%s):\n%s", tail ? tail : "", buf);
    cr_assert_eq(rc, TP_ERR_SHAPE, "the receiver's next(): %d %s", rc, err);
    cr_assert_lt(waited, 10.0, "the receiver took %.1f s to end", waited);
    cr_assert(strstr(err, "no sender left sends datapoints that fit") && strstr(err, why) &&
                  (!tail || strstr(err, tail)),
              "%s", err);
    fu_slurp(log, buf, sizeof buf);
    char who[128];
    snprintf(who, sizeof who, "tp-worker %d@", pid);
    cr_assert(strstr(buf, who) && strstr(buf, why) && (!tail || strstr(buf, tail)),
              "the receiver's log names the worker (%s) and the mismatch:\n%s", who, buf);
}

Test(proc_worker, a_worker_of_the_wrong_dtype_ends_naming_both_sides) {
    s_unfit_case("fake:shape=28x28:float32,shape=scalar:int32,size=64 | batch 8",
                 "component 0 'image' is float32[8,28,28], expected uint8[8,28,28]", 0, NULL);
}

Test(proc_worker, a_worker_of_the_wrong_shape_ends_naming_both_sides) {
    s_unfit_case("fake:shape=32x32:uint8,shape=scalar:int32,size=64 | batch 8",
                 "component 0 'image' is uint8[8,32,32], expected uint8[8,28,28]", 0, NULL);
}

Test(proc_worker, a_worker_missing_a_component_ends_naming_both_sides) {
    s_unfit_case("fake:shape=28x28:uint8,size=64 | batch 8",
                 "1 component (uint8[8,28,28]), expected 2: image uint8[8,28,28], "
                 "label int32[8]", 0, NULL);
}

/* Issue 47: a label out of the model's classes (fake's ints are 0..255,
 * the receiver takes 0..9) is a misfit like the others: the worker ends
 * naming the component, the value and the range, the receiver names the
 * worker and the same, and ends once no fitting sender is left (not at
 * step 0 of a trainer). */
Test(proc_worker, a_worker_of_labels_out_of_range_ends_naming_both_sides) {
    s_unfit_case("fake:size=64 | batch 8", "component 1 'label' has value ", 10,
                 ", expected 0..9");
}

/* Issue 47, the Python sender: tp_send.py (as a module) sending a batch
 * whose label 12 is out of the receiver's classes ends before sending it
 * (exit 1), naming the component, the value and the range; the receiver's
 * log names tp_send.py and the same, and nothing of it was taken. */
Test(proc_worker, a_python_sender_of_labels_out_of_range_ends_naming_both_sides) {
    if (system("/usr/bin/python3 -c 'import numpy, zmq' 2>/dev/null") != 0)
        cr_skip_test("/usr/bin/python3 lacks numpy or zmq (python3-numpy, python3-zmq)");
    char ep[128], pyout[128], log[128], code[1024];
    snprintf(ep, sizeof ep, "ipc://%s/pylabel.sock", s_dir);
    snprintf(pyout, sizeof pyout, "%s/pylabel.txt", s_dir);
    snprintf(log, sizeof log, "%s/pylabel.log", s_dir);
    tp_dataflow_t *r = s_fmnist_receiver(ep, log, 8, 10);
    snprintf(code, sizeof code,
             "import sys; sys.path.insert(0, '%s/tools/tp-worker')\n"
             "import numpy as np, zmq, tp_send\n"
             "s = tp_send.Sender('%s')\n"
             "try:\n"
             "    s.send([np.zeros((8, 28, 28), np.uint8), np.array([0, 1, 2, 12, 3, 4, 5, 6], "
             "np.int32)])\n"
             "except tp_send.RefusedError as e:\n"
             "    print(e, file=sys.stderr); s.sock.setsockopt(zmq.LINGER, 500); s.close(); "
             "sys.exit(1)\n"
             "s.close()\n", TP_SOURCE_DIR, ep);
    char *pargv[] = {"/usr/bin/python3", "-c", code, NULL};
    s_python_sender_refused(r, pargv, pyout, log,
                            "component 1 'label' has value 12 at [3], expected 0..9",
                            "label:int32[8]{0..9}");
}

/* Issue 47: senders that cannot check (a bound tp-worker never probes its
 * receiver, like tensorpack's senders) have their batches with a label out
 * of range dropped and counted at the receiver, with a warning naming the
 * sender, the component, the value and the range, while a fitting sender
 * goes on feeding it. */
Test(proc_worker, labels_out_of_range_are_dropped_and_counted_per_sender) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("no Fashion-MNIST (dataset-fashion-mnist)");
    char bad_ep[128], good_ep[128], eps[300], log[128], bout[128], gout[128],
        buf[65536];
    snprintf(bad_ep, sizeof bad_ep, "ipc://%s/bad.sock", s_dir);
    snprintf(good_ep, sizeof good_ep, "ipc://%s/good.sock", s_dir);
    snprintf(eps, sizeof eps, ">%s,>%s", bad_ep, good_ep);
    snprintf(log, sizeof log, "%s/drop.log", s_dir);
    snprintf(bout, sizeof bout, "%s/bad.txt", s_dir);
    snprintf(gout, sizeof gout, "%s/good.txt", s_dir);
    char *bargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec", "fake:size=64 | batch 8",
                     "--bind", bad_ep, NULL};
    char *gargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec",
                     "fashion-mnist:train | batch 8", "--bind", good_ep, NULL};
    pu_spawn_opts_t bo = {.out = bout}, go = {.out = gout};
    int bad = pu_spawn(bargv, &bo);
    int good = pu_spawn(gargv, &go);
    cr_assert_eq(tp_log_set_file(log), TP_OK);
    tp_remote_opts_t ro;
    tp_remote_opts_init(&ro);
    ro.timeout_s = 30;
    tp_dataflow_t *r = tp_df_remote(eps, &ro);
    tp_remote_expect_t want[2] = {{"image", TP_UINT8, 3, {8, 28, 28}, 0},
                                  {"label", TP_INT32, 1, {8}, 10}};
    cr_assert_eq(tp_df_remote_expect(r, want, 2), TP_OK, "%s", tp_last_error());
    cr_assert_eq(tp_dataflow_reset_state(r, 0, 0), TP_OK, "%s", tp_last_error());
    /* until the bad sender's batches were seen (and dropped) */
    int took = 0;
    for (double t0 = tp_now_s(); took < 20 || (tp_df_remote_unfit(r) < 2 &&
                                               tp_now_s() - t0 < 20); took++) {
        tp_datapoint_t *dp = NULL;
        cr_assert_eq(tp_dataflow_next(r, &dp), TP_OK, "%s", tp_last_error());
        const int32_t *y = tp_datapoint_cget(dp, 1)->data;
        for (int k = 0; k < 8; k++)
            cr_assert(y[k] >= 0 && y[k] <= 9, "a label %d came through", y[k]);
        tp_datapoint_destroy(&dp);
    }
    uint64_t unfit = tp_df_remote_unfit(r);
    tp_dataflow_destroy(&r);
    tp_log_set_file(NULL);
    kill(bad, SIGTERM);
    kill(good, SIGTERM);
    pu_waitpid(bad, 5000);
    pu_waitpid(good, 5000);
    cr_assert_geq(unfit, 2, "dropped %llu", (unsigned long long)unfit);
    fu_slurp(log, buf, sizeof buf);
    char who[64];
    snprintf(who, sizeof who, "dropped a datapoint from tp-worker %d@", bad);
    cr_assert(strstr(buf, who) && strstr(buf, "that does not fit: component 1 'label' has "
                                             "value ") &&
                  strstr(buf, ", expected 0..9"),
              "the receiver's log names the sender (%s), the value and the range:\n%s", who,
              buf);
    char good_who[64];
    snprintf(good_who, sizeof good_who, "from tp-worker %d@", good);
    cr_assert(!strstr(buf, good_who), "the fitting sender was named:\n%s", buf);
}

/* Issue 47, end to end: tp-train --remote connected to two bound
 * tp-workers, one of them with labels out of the model's classes (fake's
 * 0..255): the run trains to the end on the fitting one (it ended at step 0
 * before), its log names the other, the value and the range, and counts
 * the dropped batches (ZMQInput/unfit). */
Test(proc_worker, tp_train_drops_a_senders_labels_out_of_range_and_trains) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("no Fashion-MNIST (dataset-fashion-mnist)");
    char bad_ep[128], good_ep[128], eps[300], logdir[128], out[128], buf[65536];
    snprintf(bad_ep, sizeof bad_ep, "ipc://%s/tbad.sock", s_dir);
    snprintf(good_ep, sizeof good_ep, "ipc://%s/tgood.sock", s_dir);
    snprintf(eps, sizeof eps, ">%s,>%s", bad_ep, good_ep);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    snprintf(out, sizeof out, "%s/train.txt", s_dir);
    char *bargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec", "fake:size=64 | batch 16",
                     "--bind", bad_ep, NULL};
    char *gargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec",
                     "fashion-mnist:train | batch 16", "--bind", good_ep, NULL};
    pu_spawn_opts_t wo = {.out = "/dev/null"};
    int bad = pu_spawn(bargv, &wo);
    int good = pu_spawn(gargv, &wo);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                     "--steps-per-epoch", "20", "--batch", "16", "--remote", eps,
                     "--threads", "1", "--towers", "1", "--test-spec",
                     "fashion-mnist:test,shuffle=0 | batch 500 | fixed-size 1", "--logdir",
                     logdir, "--no-tensorboard", NULL};
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    pu_spawn_opts_t to = {.out = out, .env = env};
    int tr = pu_spawn(targv, &to);
    int st = pu_waitpid(tr, 120000);
    kill(bad, SIGTERM);
    kill(good, SIGTERM);
    pu_waitpid(bad, 5000);
    pu_waitpid(good, 5000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-train: status %d:\n%s",
              st, buf);
    char who[80];
    snprintf(who, sizeof who, "dropped a datapoint from tp-worker %d@", bad);
    cr_assert(strstr(buf, who) && strstr(buf, "component 1 'label' has value ") &&
                  strstr(buf, ", expected 0..9") && strstr(buf, "test accuracy") &&
                  !strstr(buf, "ZMQInput/unfit: 0\n") && strstr(buf, "ZMQInput/unfit: "),
              "tp-train's log (%s):\n%s", who, buf);
}

/* tp-train (targv, with env; its log in s_dir/train.txt) and one tp-worker
 * of `wspec` connecting to `ep` whose datapoints do not fit the model: the
 * worker ends at once (status 1) saying `why` (and `wsays`, NULL: nothing
 * more), and tp-train ends non-zero saying no fitting sender is left, `why`
 * (and `tsays`) and the worker's name, instead of hanging or training on
 * what does not fit. */
static void s_misfit_worker_ends_both(char *const targv[], const char *const env[],
                                      const char *wspec, const char *ep, const char *why,
                                      const char *wsays, const char *tsays) {
    char out[128], wout[128], buf[65536];
    snprintf(out, sizeof out, "%s/train.txt", s_dir);
    snprintf(wout, sizeof wout, "%s/w.txt", s_dir);
    pu_spawn_opts_t to = {.out = out, .env = env};
    int tr = pu_spawn(targv, &to);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec", (char *)wspec, "--connect",
                     (char *)ep, NULL};
    pu_spawn_opts_t wo = {.out = wout};
    int w = pu_spawn(wargv, &wo);
    double t0 = tp_now_s();
    int wst = pu_waitpid(w, 30000);
    double wdt = tp_now_s() - t0;
    int st = pu_waitpid(tr, 60000);
    fu_slurp(wout, buf, sizeof buf);
    cr_assert(wst >= 0 && WIFEXITED(wst) && WEXITSTATUS(wst) == 1 && strstr(buf, why) &&
                  (!wsays || strstr(buf, wsays)),
              "the worker (status %d after %.1f s):\n%s", wst, wdt, buf);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0, "tp-train: status %d:\n%s",
              st, buf);
    char who[64];
    snprintf(who, sizeof who, "tp-worker %d@", w);
    cr_assert(strstr(buf, "no sender left sends datapoints that fit") && strstr(buf, why) &&
                  strstr(buf, who) && (!tsays || strstr(buf, tsays)),
              "tp-train's log names the worker (%s) and the mismatch:\n%s", who, buf);
}

/* Issue 47: `tp-train --spec 'remote:...'` takes what --remote takes (its
 * model's inputs, here per datapoint before the spec's batch stage), in
 * the handshake too: a worker of another image size ends at once naming
 * both sides, and the run ends saying no fitting sender is left. */
Test(proc_worker, tp_train_spec_remote_and_a_worker_of_another_size_both_name_it) {
    char ep[128], spec[200], logdir[128];
    snprintf(ep, sizeof ep, "ipc://%s/spec.sock", s_dir);
    snprintf(spec, sizeof spec, "remote:@%s | batch 16", ep);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                     "--steps-per-epoch", "5", "--batch", "16", "--spec", spec,
                     "--threads", "1", "--towers", "1", "--test-spec",
                     "fake:size=500 | batch 500", "--logdir", logdir, "--no-tensorboard",
                     NULL};
    const char *env[] = {"TP_LOG_LEVEL=info", NULL};
    s_misfit_worker_ends_both(targv, env, "fake:shape=32x32:uint8,shape=scalar:int32,size=1000",
                              ep, "component 0 'image' is uint8[32,32], expected uint8[28,28]",
                              "image:uint8[28,28];label:int32[]{0..9}",
                              "must send image:uint8[28,28];label:int32[]{0..9}");
}

/* Issue 47: forked workers (--workers with --spec: a processes stage) run
 * the trainer's own spec, so they have no handshake; their first datapoint
 * is checked against the model's inputs all the same, and a mismatch (here
 * fake's labels, 0..255, against 10 classes) ends the run at once naming
 * the worker, the component, the value and the range, without restarts. */
Test(proc_worker, forked_workers_check_their_first_datapoint) {
    char logdir[128], out[128], buf[65536];
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    snprintf(out, sizeof out, "%s/train.txt", s_dir);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                     "--steps-per-epoch", "5", "--batch", "16", "--spec",
                     "fake:size=640 | batch 16", "--workers", "2", "--threads", "1",
                     "--towers", "1", "--test-spec", "fake:size=500 | batch 500",
                     "--logdir", logdir, "--no-tensorboard", NULL};
    pu_spawn_opts_t to = {.out = out};
    int tr = pu_spawn(targv, &to);
    int st = pu_waitpid(tr, 60000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) != 0, "tp-train: status %d:\n%s",
              st, buf);
    cr_assert(strstr(buf, "multiprocess: worker ") &&
                  strstr(buf, "made a first datapoint that does not fit: component 1 "
                              "'label' has value ") &&
                  strstr(buf, ", expected 0..9 (the model takes "
                              "image:uint8[28,28];label:int32[]{0..9} through batch)") &&
                  strstr(buf, "not restarted") && !strstr(buf, "restarting it") &&
                  !strstr(buf, "step 0"),
              "tp-train's log:\n%s", buf);
}

/* The same through tp-train --remote: its model's inputs are what it
 * takes; a worker of the wrong batch size ends at once naming both, and the
 * run ends (non-zero, saying no fitting sender is left) instead of hanging
 * or training on the wrong batch. */
Test(proc_worker, tp_train_and_a_worker_of_another_batch_both_name_the_mismatch) {
    char ep[128], bind[140], logdir[128];
    snprintf(ep, sizeof ep, "ipc://%s/train.sock", s_dir);
    snprintf(bind, sizeof bind, "@%s", ep);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--epochs", "1",
                     "--steps-per-epoch", "5", "--batch", "32", "--remote", bind,
                     "--threads", "1", "--towers", "1", "--test-spec",
                     "fake:size=500 | batch 500", "--logdir", logdir, "--no-tensorboard",
                     NULL};
    s_misfit_worker_ends_both(
        targv, NULL, "fake:size=1000 | batch 16", ep,
        "component 0 'image' is uint8[16,28,28], expected uint8[32,28,28]", NULL, NULL);
}

static int run_status(char *const argv[]) {
    char out[128];
    snprintf(out, sizeof out, "%s/out.txt", s_dir);
    int pid = spawn(argv, out);
    int st = pu_waitpid(pid, 5000);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(proc_worker, clear_errors) {
    char *help[] = {TP_BINARY_DIR "/bin/tp-worker", "--help", NULL};
    cr_assert_eq(run_status(help), 0);
    char *none[] = {TP_BINARY_DIR "/bin/tp-worker", "--connect", "ipc:///tmp/x", NULL};
    cr_assert_eq(run_status(none), 2);
    char *both[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", "x.so", NULL};
    cr_assert_eq(run_status(both), 2);
    char *missing[] = {TP_BINARY_DIR "/bin/tp-worker", "--plugin", "/nonexistent.so",
                       "--connect", "ipc:///tmp/x", NULL};
    cr_assert_eq(run_status(missing), 1);
    char *badhwm[] = {TP_BINARY_DIR "/bin/tp-worker", "--hwm", "x", NULL};
    cr_assert_eq(run_status(badhwm), 2);
    char *tophelp[] = {TP_BINARY_DIR "/bin/tp-top", "--help", NULL};
    cr_assert_eq(run_status(tophelp), 0);
    char *topnone[] = {TP_BINARY_DIR "/bin/tp-top", NULL};
    cr_assert_eq(run_status(topnone), 2);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/nobody.sock", s_dir);
    char *topsilent[] = {TP_BINARY_DIR "/bin/tp-top", "--connect", ep, "--once",
                         "--timeout", "0.3", NULL};
    cr_assert_eq(run_status(topsilent), 1);
    /* a log directory for its socket: where the run's statistics are */
    static char buf[4096];
    char *topdir[] = {TP_BINARY_DIR "/bin/tp-top", "--connect", s_dir, "--once", NULL};
    cr_assert_eq(pu_run(topdir, NULL, buf, sizeof buf), 2, "%s", buf);
    char said[256];
    snprintf(said, sizeof said, "is not ipc:// or tcp:// (a folder: a run's statistics are "
             "at --connect ipc://%s/stats.sock while it runs)", s_dir);
    cr_assert(strstr(buf, said), "%s", buf);
}

/* docs/distributed.md's rank.sh, copied as written, failed at its first
 * epoch's end: tp-train --remote --augment takes float32 images (the
 * workers' `augment` makes them), and its default validation set was
 * uint8 (`predictor: infer: input 0 'image' is uint8[500,28,28], the model
 * takes float32[batch,28,28]`). It is now normalised as the workers'. */
Test(proc_worker, tp_train_remote_augment_validates_with_its_default_test_set) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("no Fashion-MNIST (dataset-fashion-mnist)");
    char ep[128], bind[140], logdir[128], out[128], wout[128], buf[65536];
    snprintf(ep, sizeof ep, "ipc://%s/aug.sock", s_dir);
    snprintf(bind, sizeof bind, "@%s", ep);
    snprintf(logdir, sizeof logdir, "%s/log", s_dir);
    snprintf(out, sizeof out, "%s/train.txt", s_dir);
    snprintf(wout, sizeof wout, "%s/worker.txt", s_dir);
    char *wargv[] = {TP_BINARY_DIR "/bin/tp-worker", "--spec",
                     "fashion-mnist:train | augment crop=28,pad=2,flip | batch 64", "--connect",
                     ep, "--count", "10", NULL};
    char *targv[] = {TP_BINARY_DIR "/bin/tp-train", "--model", "mlp", "--augment", "--epochs",
                     "1", "--steps-per-epoch", "3", "--batch", "64", "--remote", bind,
                     "--threads", "1", "--towers", "1", "--logdir", logdir,
                     "--no-tensorboard", NULL};
    pu_spawn_opts_t wo = {.out = wout}, to = {.out = out};
    int w = pu_spawn(wargv, &wo);
    int tr = pu_spawn(targv, &to);
    int st = pu_waitpid(tr, 120000);
    pu_waitpid(w, 20000);
    fu_slurp(out, buf, sizeof buf);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "tp-train status %d:\n%s",
              st, buf);
    cr_assert(strstr(buf, "test accuracy"), "%s", buf);
}
