/* towerpack: the run's log directory (checkpoints, stats.json, log.log,
 * plots). Default train_log/<name>. When it exists and is not empty, an
 * explicit action decides what happens; an interactive question is asked
 * only when stdin is a terminal.
 *
 * A run locks its log directory for its whole life: an advisory lock on
 * DIR/.lock (which holds the owner's pid), taken before any action touches
 * the directory. A second process that asks for the same directory is
 * refused at once, naming the directory and the holder's pid, whatever its
 * action says. The kernel drops the lock when the owner ends, also by
 * kill -9: a lock is never stale. It is an open-file-description lock
 * (F_OFD_SETLK, flock() where that is missing), owned by the process that
 * took it: a forked child (a dataflow worker) closes its copy at fork, so it
 * neither holds the directory after its parent died nor releases it. */
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
    TP_LOGDIR_DELETE,    /* remove what it holds and start empty */
    TP_LOGDIR_BACKUP,    /* rename it to DIR.<timestamp>, start empty */
    TP_LOGDIR_NEW,       /* use DIR-1, DIR-2, ... (the first free name) */
} tp_logdir_action_t;

/* The lock a run holds on its log directory (see above). */
typedef struct tp_logdir_lock tp_logdir_lock_t;

/* Parse "ask", "keep", "delete", "backup" or "new". */
tp_status_t tp_logdir_action_parse(const char *s, tp_logdir_action_t *action);

/* Create or prepare `dir` (parents too) by `action` and lock it; the
 * directory actually used goes to out[size] (differs from dir with
 * TP_LOGDIR_NEW). The lock is checked before anything is deleted or moved:
 * a directory locked by another process is refused (TP_ERR_STATE, naming it
 * and the pid), except by TP_LOGDIR_NEW, which leaves it alone and takes
 * the next free name. A directory that holds nothing of a run (only the
 * lock file, or only the log.log of a run that stopped before it wrote
 * anything else) counts as empty: no action needed. The lock goes to *lock
 * (caller owns; release it with tp_logdir_lock_destroy when the run is
 * over); lock NULL: held until this process ends. */
tp_status_t tp_logdir_prepare(const char *dir, tp_logdir_action_t action,
                              char *out, size_t size, tp_logdir_lock_t **lock);

/* Lock the existing directory `dir` for this process (see above). A
 * directory this process has locked already gets another reference to the
 * same lock. NULL with tp_last_error() set when another process holds it
 * (TP_ERR_STATE: the message names dir and the holder's pid) or the lock
 * file cannot be made. Caller owns. */
tp_logdir_lock_t *tp_logdir_lock_new(const char *dir);

/* Drop a reference; the last one releases the lock (the file stays: see
 * logdir.c). Accepts NULL; nulls the caller's pointer. */
void tp_logdir_lock_destroy(tp_logdir_lock_t **self_p);

/* The pid of the process that holds `dir`'s lock (this one's own pid when
 * it holds it), 0 when nobody does, -1 when it cannot be told. */
int tp_logdir_lock_holder(const char *dir);

/* 1 when `dir` is missing or holds nothing of a run (see
 * tp_logdir_prepare), 0 otherwise. */
int tp_logdir_is_fresh(const char *dir);

/* mkdir -p with mode 0755. */
tp_status_t tp_mkdirs(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
