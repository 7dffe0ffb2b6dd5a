/* tp-top: a live view of actor statistics. Subscribes to a stats endpoint
 * (a supervisor's, tp-worker's or tp-bench's --stats) and redraws a table
 * once a second, one row per actor, the bottleneck marked. --once prints
 * one snapshot and exits; --json prints it as JSON. Given several
 * endpoints, or a training run's ipc://DIR/stats.sock beside which the
 * other MPI ranks publish (DIR/stats-rankN.sock), it merges the latest
 * snapshot of every publisher into one table with a RANK column, the
 * bottleneck chosen among the rows of all. */
#include <czmq.h>
#include <getopt.h>
#include <glob.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <towerpack/towerpack.h>

static void s_usage(FILE *out) {
    fprintf(out,
        "usage: tp-top --connect ENDPOINT[,ENDPOINT...] [--once] [--json] [--timeout S]\n"
        "              [--curve DIR] [--columns]\n"
        "Show the statistics a towerpack run publishes (ipc://RUN_DIR/stats.sock\n"
        "for a training run; tp-worker and tp-bench with --stats), refreshed\n"
        "every second, one row per actor.\n"
        "\n"
        "  --connect ENDPOINT  the stats endpoint (ipc://PATH or tcp://HOST:PORT);\n"
        "                      several (repeated or comma-separated) are merged;\n"
        "                      beside ipc://DIR/stats.sock, every DIR/stats-rank*.sock\n"
        "                      (the other ranks of an mpirun) is merged too\n"
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
        "the first (most upstream) one that starves (a stalled input).\n"
        "With several publishers (the ranks of an mpirun) the table starts with\n"
        "RANK, the rank whose process publishes the row (- for others), and the\n"
        "bottleneck is chosen among the rows of all; the JSON rows have \"rank\".\n");
}

/* ---- several publishers (issue 47: the ranks of an mpirun) ----------------- */

#define MAX_PUBS 64
#define MAX_EPS 64

/* The latest snapshot of one publisher (its pid and source). */
typedef struct {
    tp_stats_snapshot_t snap;
    double seen;   /* when it came (tp_now_s) */
} s_pub_t;

/* The rank a training rank's source names ("tp-train/r3"), -1 for others. */
static int s_rank(const char *source) {
    const char *p = strstr(source, "/r");
    char *end;
    long r = p ? strtol(p + 2, &end, 10) : -1;
    return p && end > p + 2 && !*end && r >= 0 ? (int)r : -1;
}

static int s_by_rank(const void *a, const void *b) {
    const s_pub_t *x = a, *y = b;
    int rx = s_rank(x->snap.source), ry = s_rank(y->snap.source);
    if (rx != ry)
        return rx < 0 ? 1 : ry < 0 ? -1 : rx - ry;
    return (int)x->snap.pid - (int)y->snap.pid;
}

/* One snapshot of the rows of every publisher, in rank order; ranks[i] is
 * row i's publisher's rank. Every row names its pid (the merged snapshot's
 * own is the first publisher's). */
static int s_merge(s_pub_t *pubs, int npubs, tp_stats_snapshot_t *out, int **ranks) {
    qsort(pubs, (size_t)npubs, sizeof *pubs, s_by_rank);
    int n = 0;
    for (int i = 0; i < npubs; i++)
        n += pubs[i].snap.nrows;
    tp_stats_snapshot_init(out);
    out->rows = calloc((size_t)(n ? n : 1), sizeof *out->rows);
    *ranks = calloc((size_t)(n ? n : 1), sizeof **ranks);
    if (!out->rows || !*ranks) {
        free(*ranks);
        *ranks = NULL;
        return -1;
    }
    snprintf(out->source, sizeof out->source, "merged");
    out->pid = pubs[0].snap.pid;
    out->seq = pubs[0].snap.seq;
    out->wall_s = pubs[0].snap.wall_s;
    for (int i = 0; i < npubs; i++) {
        const tp_stats_snapshot_t *s = &pubs[i].snap;
        if (s->interval_s > out->interval_s)
            out->interval_s = s->interval_s;
        for (int k = 0; k < s->nrows; k++) {
            out->rows[out->nrows] = s->rows[k];
            if (!out->rows[out->nrows].pid)
                out->rows[out->nrows].pid = s->pid;
            (*ranks)[out->nrows++] = s_rank(s->source);
        }
    }
    return 0;
}

static void s_merged_table(s_pub_t *pubs, int npubs, const tp_stats_snapshot_t *m,
                           const int *ranks, int clear) {
    if (clear)
        fputs("\033[H\033[2J", stdout);
    int bn = tp_stats_bottleneck(m);
    printf("towerpack: %d publishers:", npubs);
    for (int i = 0; i < npubs; i++)
        printf("%s %s (pid %u)", i ? "," : "", pubs[i].snap.source, pubs[i].snap.pid);
    printf("  interval %.2f s\n", m->interval_s);
    printf("%-4s %-24s %-12s %7s %-10s %10s %9s %6s %8s %8s %8s\n", "RANK", "ACTOR", "HOST",
           "PID", "STATE", "MSGS/S", "MB/S", "QUEUE", "BUSY%", "STARVED%", "BLOCKED%");
    for (int i = 0; i < m->nrows; i++) {
        const tp_stats_row_t *r = &m->rows[i];
        char q[16], rk[16];
        if (r->queue_fill < 0)
            snprintf(q, sizeof q, "-");
        else
            snprintf(q, sizeof q, "%.0f%%", 100 * r->queue_fill);
        if (ranks[i] < 0)
            snprintf(rk, sizeof rk, "-");
        else
            snprintf(rk, sizeof rk, "%d", ranks[i]);
        printf("%-4s %-24.24s %-12.12s %7u %-10s %10.1f %9.2f %6s %8.1f %8.1f %8.1f%s\n", rk,
               r->name, r->host, r->pid, tp_actor_state_name(r->state), r->msgs_per_s,
               r->mb_per_s, q, r->busy_pct, r->starved_pct, r->blocked_pct,
               i == bn ? "  <== bottleneck" : "");
    }
    fflush(stdout);
}

/* The merged snapshot as JSON: tp_stats_to_json's document, each actor
 * with its "rank" (null for none), and "publishers": [{source, pid, rank}]. */
static void s_merged_json(s_pub_t *pubs, int npubs, const tp_stats_snapshot_t *m,
                          const int *ranks) {
    char *text = tp_stats_to_json(m);
    json_t *root = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!root)
        return;
    json_t *actors = json_object_get(root, "actors");
    for (size_t i = 0; i < json_array_size(actors) && (int)i < m->nrows; i++)
        json_object_set_new(json_array_get(actors, i), "rank",
                            ranks[i] < 0 ? json_null() : json_integer(ranks[i]));
    json_t *ps = json_array();
    for (int i = 0; i < npubs; i++) {
        int r = s_rank(pubs[i].snap.source);
        json_array_append_new(ps, json_pack("{s:s, s:I, s:o}", "source", pubs[i].snap.source,
                                            "pid", (json_int_t)pubs[i].snap.pid, "rank",
                                            r < 0 ? json_null() : json_integer(r)));
    }
    json_object_set_new(root, "publishers", ps);
    char *out = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (out) {
        puts(out);
        free(out);
    }
    fflush(stdout);
}

/* Connect `sub` to ep unless it already is (eps[*n]); 0 or -1. */
static int s_add_endpoint(zsock_t *sub, char eps[][512], int *n, const char *ep) {
    for (int i = 0; i < *n; i++)
        if (!strcmp(eps[i], ep))
            return 0;
    if (*n == MAX_EPS)
        return 0;
    if (zsock_connect(sub, "%s", ep) < 0) {
        fprintf(stderr, "tp-top: connect %s: %s\n", ep, zmq_strerror(zmq_errno()));
        return -1;
    }
    if (ep != eps[*n])  /* the given ones are in place already */
        snprintf(eps[*n], 512, "%s", ep);
    (*n)++;
    return 0;
}

/* The other ranks' sockets beside each ipc://DIR/stats.sock given. */
static void s_discover(zsock_t *sub, char eps[][512], int *n, int given) {
    for (int i = 0; i < given; i++) {
        const char *ep = eps[i];
        size_t len = strlen(ep);
        if (strncmp(ep, "ipc://", 6) || len < 17 || strcmp(ep + len - 11, "/stats.sock"))
            continue;
        char pat[600];
        snprintf(pat, sizeof pat, "%.*s/stats-rank*.sock", (int)(len - 6 - 11), ep + 6);
        glob_t g;
        if (glob(pat, 0, NULL, &g) != 0)
            continue;
        for (size_t k = 0; k < g.gl_pathc; k++) {
            char found[600];
            snprintf(found, sizeof found, "ipc://%s", g.gl_pathv[k]);
            s_add_endpoint(sub, eps, n, found);
        }
        globfree(&g);
    }
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
    static char eps[MAX_EPS][512];
    int neps = 0;
    int once = 0, json = 0;
    double timeout = 5;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c':
            ep = optarg;
            for (const char *p = optarg; *p;) {  /* comma-separated */
                size_t len = strcspn(p, ",");
                if (len && neps < MAX_EPS && len < sizeof eps[0])
                    snprintf(eps[neps++], sizeof eps[0], "%.*s", (int)len, p);
                p += len + (p[len] == ',');
            }
            break;
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
    for (int i = 0; i < neps; i++)
        if (strncmp(eps[i], "ipc://", 6) && strncmp(eps[i], "tcp://", 6)) {
            /* a log directory given for its socket (LOGDIR/stats.sock) */
            struct stat st;
            int dir = stat(eps[i], &st) == 0 && S_ISDIR(st.st_mode);
            fprintf(stderr, "tp-top: endpoint '%s' is not ipc:// or tcp://%s%s%s\n", eps[i],
                    dir ? " (a folder: a run's statistics are at --connect ipc://" : "",
                    dir ? eps[i] : "", dir ? "/stats.sock while it runs)" : "");
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
    int given = neps, ncon = 0;
    for (int i = 0; sub && i < given; i++)
        if (s_add_endpoint(sub, eps, &ncon, eps[i]) < 0) {
            zsock_destroy(&sub);
            return 1;
        }
    if (!sub) {
        fprintf(stderr, "tp-top: socket: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    neps = ncon;
    s_discover(sub, eps, &neps, given);
    zsock_set_subscribe(sub, "");
    zsock_set_rcvtimeo(sub, 200);
    tp_stats_snapshot_t snap;
    tp_stats_snapshot_init(&snap);
    double last = tp_now_s();
    int code = 0, shown = 0;
    uint64_t bad = 0;
    /* several publishers: the latest snapshot of each, merged */
    static s_pub_t pubs[MAX_PUBS];
    int npubs = 0;
    double discovered = tp_now_s(), printed = 0, first = 0;
    while (!s_stop) {
        double now = tp_now_s();
        if (now - discovered >= 1.0) {  /* a rank's socket appears when it starts */
            s_discover(sub, eps, &neps, given);
            discovered = now;
        }
        for (int i = 0; i < npubs; i++)  /* a rank that ended, a publisher gone */
            if (now - pubs[i].seen > 3.0) {
                tp_stats_snapshot_fini(&pubs[i].snap);
                pubs[i--] = pubs[--npubs];
            }
        int multi = neps > 1 || npubs > 1;
        /* --once with several: every endpoint heard, or 2 s after the first */
        int due = multi && npubs > 0 &&
                  (once ? npubs >= neps || now - first >= 2.0 : now - printed >= 1.0);
        if (due) {
            tp_stats_snapshot_t m;
            int *ranks = NULL;
            if (s_merge(pubs, npubs, &m, &ranks) == 0) {
                if (json)
                    s_merged_json(pubs, npubs, &m, ranks);
                else
                    s_merged_table(pubs, npubs, &m, ranks, !once && isatty(1));
                shown = 1;
            }
            free(ranks);
            tp_stats_snapshot_fini(&m);
            printed = now;
            if (once)
                break;
        }
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
        int k = 0;
        while (k < npubs && !(pubs[k].snap.pid == snap.pid &&
                              !strcmp(pubs[k].snap.source, snap.source)))
            k++;
        if (k == npubs && npubs < MAX_PUBS)
            tp_stats_snapshot_init(&pubs[npubs++].snap);
        if (k < npubs) {  /* the publisher's latest: moved in, snap emptied */
            tp_stats_snapshot_fini(&pubs[k].snap);
            pubs[k].snap = snap;
            pubs[k].seen = last;
            tp_stats_snapshot_init(&snap);
            if (!first)
                first = last;
        }
        if (neps > 1 || npubs > 1) {
            continue;  /* merged above, once a second */
        }
        const tp_stats_snapshot_t *one = k < npubs ? &pubs[k].snap : &snap;
        if (json) {
            char *text = tp_stats_to_json(one);
            if (text) {
                puts(text);
                free(text);
            }
            fflush(stdout);
        } else {
            s_table(one, !once && isatty(1));
        }
        shown = 1;
        if (once)
            break;
    }
    tp_stats_snapshot_fini(&snap);
    for (int i = 0; i < npubs; i++)
        tp_stats_snapshot_fini(&pubs[i].snap);
    zsock_destroy(&sub);
    return code;
}
