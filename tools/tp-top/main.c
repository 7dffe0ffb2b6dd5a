/* tp-top: a live view of actor statistics. Subscribes to a stats endpoint
 * (a supervisor's, tp-worker's or tp-bench's --stats) and redraws a table
 * once a second, one row per actor, the bottleneck marked. --once prints
 * one snapshot and exits; --json prints it as JSON. */
#include <czmq.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <towerpack/towerpack.h>

static void s_usage(FILE *out) {
    fprintf(out,
        "usage: tp-top --connect ENDPOINT [--once] [--json] [--timeout S] [--curve DIR]\n"
        "Show the statistics a towerpack run publishes (ipc://RUN_DIR/stats.sock\n"
        "for a training run; tp-worker and tp-bench with --stats), refreshed\n"
        "every second, one row per actor.\n"
        "\n"
        "  --connect ENDPOINT  the stats endpoint (ipc://PATH or tcp://HOST:PORT)\n"
        "  --once              print one snapshot and exit\n"
        "  --json              print snapshots as JSON (one document each)\n"
        "  --timeout S         give up when nothing arrives for S seconds (5)\n"
        "  --curve DIR         CURVE keys (tp-keygen DIR) of a run whose tcp stats\n"
        "                      socket is authenticated\n"
        "  --columns           print the table's column line and exit\n"
        "  -h, --help          this text\n"
        "\n"
        "Columns: host and pid are the process the actor runs in (a forked\n"
        "worker's own, a remote tp-worker's own host and pid);\n"
        "msgs/s and MB/s are the larger of in and out over the last\n"
        "interval; queue is the input queue's fill (- when not visible); starved\n"
        "is time spent waiting for input, blocked time spent waiting on a full\n"
        "output. The bottleneck (<==) is the busiest actor that neither waits\n"
        "for input nor for output most of the time; when every actor waits,\n"
        "the first (most upstream) one that starves (a stalled input).\n");
}

/* The table's column line (also --columns: the docs' samples are checked
 * against it). */
static void s_header(void) {
    printf("%-24s %-12s %7s %-10s %10s %9s %6s %8s %8s %8s\n", "ACTOR", "HOST", "PID",
           "STATE", "MSGS/S", "MB/S", "QUEUE", "BUSY%", "STARVED%", "BLOCKED%");
}

static void s_table(const tp_stats_snapshot_t *snap, int clear) {
    if (clear)
        fputs("\033[H\033[2J", stdout);
    int bn = tp_stats_bottleneck(snap);
    printf("towerpack %s (pid %u)  snapshot %llu  interval %.2f s\n", snap->source,
           snap->pid, (unsigned long long)snap->seq, snap->interval_s);
    s_header();
    for (int i = 0; i < snap->nrows; i++) {
        const tp_stats_row_t *r = &snap->rows[i];
        char q[16];
        if (r->queue_fill < 0)
            snprintf(q, sizeof q, "-");
        else
            snprintf(q, sizeof q, "%.0f%%", 100 * r->queue_fill);
        /* rare and worth seeing: only a row that has them says so */
        char restarts[32] = "";
        if (r->restarts > 0)
            snprintf(restarts, sizeof restarts, "  (%u restart%s)", r->restarts,
                     r->restarts == 1 ? "" : "s");
        /* the process it runs in: the publisher's unless the row says */
        printf("%-24.24s %-12.12s %7u %-10s %10.1f %9.2f %6s %8.1f %8.1f %8.1f%s%s\n",
               r->name, r->host, r->pid ? r->pid : snap->pid, tp_actor_state_name(r->state),
               r->msgs_per_s, r->mb_per_s, q,
               r->busy_pct, r->starved_pct, r->blocked_pct,
               i == bn ? "  <== bottleneck" : "", restarts);
    }
    fflush(stdout);
}

static volatile sig_atomic_t s_stop;
static void s_on_signal(int sig) {
    (void)sig;
    s_stop = 1;
}

int main(int argc, char **argv) {
    static const struct option longopts[] = {
        {"connect", required_argument, 0, 'c'}, {"once", no_argument, 0, 'o'},
        {"json", no_argument, 0, 'j'},          {"timeout", required_argument, 0, 't'},
        {"curve", required_argument, 0, 'k'},    {"columns", no_argument, 0, 'C'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    const char *ep = NULL, *curve_dir = NULL;
    int once = 0, json = 0;
    double timeout = 5;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c': ep = optarg; break;
        case 'k': curve_dir = optarg; break;
        case 'o': once = 1; break;
        case 'j': json = 1; break;
        case 't':
            timeout = strtod(optarg, &end);
            if (*end || timeout <= 0) {
                fprintf(stderr, "tp-top: --timeout '%s' is not a positive number\n", optarg);
                return 2;
            }
            break;
        case 'C': s_header(); return 0;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (!ep || optind < argc) {
        fprintf(stderr, "tp-top: %s\n", ep ? "unexpected argument" : "--connect ENDPOINT is required");
        s_usage(stderr);
        return 2;
    }
    if (strncmp(ep, "ipc://", 6) && strncmp(ep, "tcp://", 6)) {
        fprintf(stderr, "tp-top: endpoint '%s' is not ipc:// or tcp://\n", ep);
        return 2;
    }
    zsys_handler_set(NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    zsock_t *sub = zsock_new(ZMQ_SUB);
    if (sub && curve_dir) {
        /* The connecting side is the CURVE client. */
        tp_curve_t *cv = tp_curve_load(curve_dir, 0);
        if (!cv || tp_curve_apply(cv, zsys_init(), zsock_resolve(sub)) < 0) {
            fprintf(stderr, "tp-top: --curve %s: %s\n", curve_dir, tp_last_error());
            tp_curve_destroy(&cv);
            zsock_destroy(&sub);
            return 1;
        }
        tp_curve_destroy(&cv);
    }
    if (!sub || zsock_connect(sub, "%s", ep) < 0) {
        fprintf(stderr, "tp-top: connect %s: %s\n", ep, zmq_strerror(zmq_errno()));
        zsock_destroy(&sub);
        return 1;
    }
    zsock_set_subscribe(sub, "");
    zsock_set_rcvtimeo(sub, 200);
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    double last = tp_now_s();
    int code = 0, shown = 0;
    uint64_t bad = 0;
    while (!s_stop) {
        zframe_t *f = zframe_recv(sub);
        if (!f) {
            if (tp_now_s() - last > timeout) {
                fprintf(stderr, "tp-top: no statistics from %s for %.3g s%s\n", ep,
                        timeout, shown ? "" : " (is the run publishing there?)");
                code = 1;
                break;
            }
            continue;
        }
        tp_status_t rc = tp_stats_decode(zframe_data(f), zframe_size(f), &snap);
        zframe_destroy(&f);
        if (rc < 0) {
            if (bad++ == 0)
                fprintf(stderr, "tp-top: ignoring a bad message: %s\n", tp_last_error());
            continue;
        }
        last = tp_now_s();
        if (json) {
            char *text = tp_stats_to_json(&snap);
            if (text) {
                puts(text);
                free(text);
            }
            fflush(stdout);
        } else {
            s_table(&snap, !once && isatty(1));
        }
        shown = 1;
        if (once)
            break;
    }
    tp_stats_snapshot_fini(&snap);
    zsock_destroy(&sub);
    return code;
}
