/* towerpack: the run's log directory (checkpoints, stats.json, log.log,
 * plots). Default train_log/<name>. When it exists and is not empty, an
 * explicit action decides what happens; an interactive question is asked
 * only when stdin is a terminal. */
#ifndef TOWERPACK_LOGDIR_H
#define TOWERPACK_LOGDIR_H

#include <stddef.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TP_LOGDIR_ASK = 0,   /* ask on a terminal; otherwise an error */
    TP_LOGDIR_KEEP,      /* use it as it is (resume) */
    TP_LOGDIR_DELETE,    /* remove it and start empty */
    TP_LOGDIR_BACKUP,    /* rename it to DIR.<timestamp>, start empty */
    TP_LOGDIR_NEW,       /* use DIR-1, DIR-2, ... (the first free name) */
} tp_logdir_action_t;

/* Parse "ask", "keep", "delete", "backup" or "new". */
tp_status_t tp_logdir_action_parse(const char *s, tp_logdir_action_t *action);

/* Create or prepare `dir` (parents too) by `action`; the directory actually
 * used goes to out[size] (differs from dir with TP_LOGDIR_NEW). */
tp_status_t tp_logdir_prepare(const char *dir, tp_logdir_action_t action,
                              char *out, size_t size);

/* mkdir -p with mode 0755. */
tp_status_t tp_mkdirs(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
