/* towerpack pipeline: monitors. JSONWriter keeps DIR/stats.json (a list of
 * one object per epoch, like tensorpack's), ScalarPrinter logs every
 * scalar at epoch end, and PeakMemoryTracker puts the trainer's memory. */
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <towerpack/callback.h>
#include <towerpack/fileio.h>
#include <towerpack/log.h>
#include <towerpack/process.h>
#include "pipeline/callbacks/cb_internal.h"

typedef struct {
    json_t *records;   /* array of objects */
    char path[4096];
} s_json_t;

/* Write the records of `old` to PATH.<MMDD-HHMMSS> (the first free name)
 * before the ones from `kept` on are dropped. */
static tp_status_t s_json_backup(const char *path, json_t *old, size_t kept,
                                 int64_t start) {
    char bak[4200], stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%m%d-%H%M%S", &tm);
    snprintf(bak, sizeof bak, "%s.%s", path, stamp);
    struct stat st;
    for (int i = 1; stat(bak, &st) == 0; i++)
        snprintf(bak, sizeof bak, "%s.%s-%d", path, stamp, i);
    char *text = json_dumps(old, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    if (!text)
        return tp_error(TP_ERR_NOMEM, "JSONWriter: serialising %s", bak);
    size_t len = strlen(text);
    text[len] = '\n';
    tp_status_t rc = tp_file_write_atomic(bak, text, len + 1);
    free(text);
    if (rc < 0)
        return tp_error_wrap(rc, "JSONWriter: keeping the history of %s", path);
    TP_WARN("JSONWriter: %s holds %zu epoch record%s that this run (from epoch %lld) "
            "writes again: the whole history is kept in %s", path,
            json_array_size(old) - kept, json_array_size(old) - kept == 1 ? "" : "s",
            (long long)start, bak);
    return TP_OK;
}

static tp_status_t json_before_train(void *impl, tp_trainer_t *tr) {
    s_json_t *j = impl;
    const char *dir = tp_trainer_logdir(tr);
    if (!dir)
        return tp_error(TP_ERR_STATE, "JSONWriter needs a log directory "
                        "(tp_trainer_set_logdir)");
    snprintf(j->path, sizeof j->path, "%s/stats.json", dir);
    json_decref(j->records);
    j->records = NULL;
    struct stat st;
    int64_t start = tp_trainer_schedule(tr)->starting_epoch;
    if (stat(j->path, &st) == 0) {
        json_error_t err;
        json_t *old = json_load_file(j->path, 0, &err);
        if (!old)
            return tp_error(TP_ERR_FORMAT, "%s: line %d, column %d: %s",
                            j->path, err.line, err.column, err.text);
        if (!json_is_array(old)) {
            json_decref(old);
            return tp_error(TP_ERR_FORMAT, "%s: not a list of epoch records",
                            j->path);
        }
        /* Resume: keep what happened before starting_epoch, drop records of
         * epochs that will run again. */
        size_t kept = 0;
        for (size_t i = 0; i < json_array_size(old); i++) {
            json_t *ep = json_object_get(json_array_get(old, i), "epoch_num");
            if (json_is_integer(ep) && json_integer_value(ep) < start)
                kept++;
            else
                break;
        }
        /* Records dropped are an earlier run's history (a resume from an
         * older checkpoint, or from none: its checkpoints were removed):
         * the whole file is kept beside, as tensorpack's JSONWriter does. */
        if (kept < json_array_size(old)) {
            tp_status_t rc = s_json_backup(j->path, old, kept, start);
            if (rc < 0) {
                json_decref(old);
                return rc;
            }
        }
        while (json_array_size(old) > kept)
            json_array_remove(old, json_array_size(old) - 1);
        j->records = old;
        TP_INFO("JSONWriter: %s has %zu epoch records before epoch %lld",
                j->path, kept, (long long)start);
    } else {
        j->records = json_array();
        if (!j->records)
            return tp_error(TP_ERR_NOMEM, "JSONWriter");
    }
    return TP_OK;
}

static tp_status_t json_trigger_epoch(void *impl, tp_trainer_t *tr) {
    s_json_t *j = impl;
    json_t *rec = json_object();
    if (!rec)
        return tp_error(TP_ERR_NOMEM, "JSONWriter");
    json_object_set_new(rec, "epoch_num", json_integer(tp_trainer_epoch_num(tr)));
    json_object_set_new(rec, "global_step", json_integer(tp_trainer_global_step(tr)));
    for (size_t i = 0; i < tp_trainer_scalar_count(tr); i++) {
        const char *name = tp_trainer_scalar_name(tr, i);
        double v = 0;
        tp_trainer_get_scalar(tr, name, &v);
        /* JSON has no NaN or Inf: those become null. */
        json_object_set_new(rec, name, isfinite(v) ? json_real(v) : json_null());
    }
    json_array_append_new(j->records, rec);
    char *text = json_dumps(j->records, JSON_INDENT(1) | JSON_REAL_PRECISION(10));
    if (!text)
        return tp_error(TP_ERR_NOMEM, "JSONWriter: serialising %s", j->path);
    size_t len = strlen(text);
    text[len] = '\n';  /* json_dumps leaves room: overwrite the NUL */
    tp_status_t rc = tp_file_write_atomic(j->path, text, len + 1);
    free(text);
    if (rc < 0)
        return tp_error_wrap(rc, "JSONWriter");
    return TP_OK;
}

static void json_destroy(void *impl) {
    s_json_t *j = impl;
    json_decref(j->records);
    free(j);
}

static const tp_callback_ops_t s_json_ops = {
    .name = "JSONWriter",
    .before_train = json_before_train,
    .trigger_epoch = json_trigger_epoch,
    .destroy = json_destroy,
};

tp_callback_t *tp_cb_json_writer(void) {
    s_json_t *j = tp_cb_impl_alloc(sizeof *j, "JSONWriter");
    if (!j)
        return NULL;
    return tp_callback_new(&s_json_ops, j, 1);
}

/* ---- ScalarPrinter ----------------------------------------------------------- */

static tp_status_t printer_trigger_epoch(void *impl, tp_trainer_t *tr) {
    for (size_t i = 0; i < tp_trainer_scalar_count(tr); i++) {
        const char *name = tp_trainer_scalar_name(tr, i);
        double v = 0;
        tp_trainer_get_scalar(tr, name, &v);
        TP_INFO("%s: %.6g", name, v);
    }
    return TP_OK;
}

static const tp_callback_ops_t s_printer_ops = {
    .name = "ScalarPrinter",
    .trigger_epoch = printer_trigger_epoch,
};

tp_callback_t *tp_cb_scalar_printer(void) {
    return tp_callback_new(&s_printer_ops, NULL, 1);
}

/* ---- PeakMemoryTracker ---------------------------------------------------------
 * This process's resident memory: its peak during each epoch (the kernel's
 * peak is reset at before_epoch; where the kernel refuses, the peak since
 * the start, said once) and what it holds at the epoch's end. The forked
 * dataflow workers' own come from the input (memory/workerN_*). */

typedef struct {
    int per_epoch;   /* the peak is reset every epoch */
} s_peakmem_t;

static tp_status_t peakmem_before_epoch(void *impl, tp_trainer_t *tr) {
    (void)tr;
    s_peakmem_t *m = impl;
    if (m->per_epoch && tp_process_reset_peak() != TP_OK) {
        TP_INFO("PeakMemoryTracker: %s; memory/peak_rss_mb is the peak since the "
                "start", tp_last_error());
        m->per_epoch = 0;
    }
    return TP_OK;
}

static tp_status_t peakmem_after_epoch(void *impl, tp_trainer_t *tr) {
    (void)impl;
    int64_t rss, peak;
    if (tp_process_memory(0, &rss, &peak) != TP_OK)
        return TP_OK;  /* no /proc: nothing to say */
    tp_trainer_put_scalar(tr, "memory/peak_rss_mb", (double)peak / 1024.0);
    tp_trainer_put_scalar(tr, "memory/rss_mb", (double)rss / 1024.0);
    return TP_OK;
}

static const tp_callback_ops_t s_peakmem_ops = {
    .name = "PeakMemoryTracker",
    .before_epoch = peakmem_before_epoch,
    .after_epoch = peakmem_after_epoch,
    .destroy = free,
};

tp_callback_t *tp_cb_peak_memory(void) {
    s_peakmem_t *m = tp_cb_impl_alloc(sizeof *m, "PeakMemoryTracker");
    if (!m)
        return NULL;
    m->per_epoch = 1;
    return tp_callback_new(&s_peakmem_ops, m, 0);
}
