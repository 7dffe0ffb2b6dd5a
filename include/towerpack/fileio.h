/* towerpack: atomic file writes (checkpoints, stats.json). */
#ifndef TOWERPACK_FILEIO_H
#define TOWERPACK_FILEIO_H

#include <stddef.h>
#include <towerpack/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Replace `path` with `size` bytes atomically: written to PATH.tmp.<pid>,
 * fsync'ed, renamed over path, directory fsync'ed. On failure the old file
 * is untouched and the temporary file removed. */
tp_status_t tp_file_write_atomic(const char *path, const void *data,
                                 size_t size);

/* The same in pieces, for writers that stream (open, write..., commit or
 * abort). Held by value. */
typedef struct tp_atomic_file {
    int fd;
    char path[4096];
    char tmp[4128];
} tp_atomic_file_t;

tp_status_t tp_atomic_file_open(tp_atomic_file_t *f, const char *path);
tp_status_t tp_atomic_file_write(tp_atomic_file_t *f, const void *data,
                                 size_t size);
/* fsync, rename, fsync the directory. On failure the target is untouched. */
tp_status_t tp_atomic_file_commit(tp_atomic_file_t *f);
/* Drop the temporary file; accepts an already finished file. */
void tp_atomic_file_abort(tp_atomic_file_t *f);

/* Remove from dir the temporaries ("NAME.tmp.PID") that a process which is
 * gone left behind (killed between open and commit); returns how many. */
int tp_atomic_file_sweep(const char *dir);

/* Unlink the temporaries of the writes in progress in this process, for a
 * process about to _exit in the middle of one (the stop deadline of
 * supervisor.h): async-signal-safe, the writes' targets untouched. */
void tp_atomic_file_unlink_pending(void);
/* List a file the same _exit unlinks with those temporaries: an ipc
 * socket's path outside a run directory (the stats socket in a logdir,
 * which a stop cut short by the deadline would leave behind). `path` must
 * stay valid until tp_unlink_at_exit_drop. */
void tp_unlink_at_exit_add(const char *path);
void tp_unlink_at_exit_drop(const char *path);

/* A process's private directory for its ipc sockets (a supervisor's, a
 * worker pool's): made as TMPDIR/PREFIX-XXXXXX (mode 0700) and listed, so a
 * process that must _exit at once can remove it with what is in it. */
tp_status_t tp_run_dir_make(char *dir, size_t size, const char *prefix);
/* Unlist and rmdir (the sockets in it are closed and unlinked by then). */
void tp_run_dir_remove(const char *dir);
/* Remove every listed run directory and its entries: async-signal-safe, for
 * the same _exit as tp_atomic_file_unlink_pending. */
void tp_run_dirs_remove_now(void);

#ifdef __cplusplus
}
#endif
#endif
