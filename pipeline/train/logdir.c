/* towerpack pipeline: preparing the log directory (tensorpack's
 * logger.set_logger_dir actions: keep, delete, backup, new). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <towerpack/log.h>
#include <towerpack/logdir.h>

static const char *s_names[] = {"ask", "keep", "delete", "backup", "new"};

tp_status_t tp_logdir_action_parse(const char *s, tp_logdir_action_t *action) {
    for (int i = 0; i < 5; i++)
        if (s && strcasecmp(s, s_names[i]) == 0) {
            *action = (tp_logdir_action_t)i;
            return TP_OK;
        }
    return tp_error(TP_ERR_INVALID, "log directory action '%s' is not one of "
                    "keep, delete, backup, new, ask", s ? s : "(null)");
}

tp_status_t tp_mkdirs(const char *dir) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return tp_error(TP_ERR_INVALID, "path too long: %s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return tp_error(TP_ERR_IO, "mkdir %s: %s", path, strerror(errno));
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return tp_error(TP_ERR_IO, "mkdir %s: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return tp_error(TP_ERR_IO, "%s exists and is not a directory", path);
    return TP_OK;
}

static int s_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return 1;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            empty = 0;
            break;
        }
    closedir(d);
    return empty;
}

static int s_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static tp_status_t s_copy_out(char *out, size_t size, const char *dir) {
    if (snprintf(out, size, "%s", dir) >= (int)size)
        return tp_error(TP_ERR_INVALID, "path too long: %s", dir);
    return TP_OK;
}

tp_status_t tp_logdir_prepare(const char *dir, tp_logdir_action_t action,
                              char *out, size_t size) {
    struct stat st;
    if (stat(dir, &st) != 0 || s_is_empty(dir)) {
        TP_TRY(tp_mkdirs(dir));
        return s_copy_out(out, size, dir);
    }
    if (!S_ISDIR(st.st_mode))
        return tp_error(TP_ERR_IO, "log directory %s exists and is not a directory", dir);
    if (action == TP_LOGDIR_ASK) {
        if (!isatty(STDIN_FILENO))
            return tp_error(TP_ERR_STATE,
                            "log directory %s exists and is not empty; say what "
                            "to do with it: keep (resume), delete, backup or new "
                            "(stdin is not a terminal, so towerpack does not ask)",
                            dir);
        fprintf(stderr, "log directory %s exists. [k]eep, [d]elete, [b]ackup, "
                        "[n]ew, [q]uit? ", dir);
        char line[16] = "";
        if (!fgets(line, sizeof line, stdin))
            line[0] = 'q';
        switch (line[0]) {
        case 'k': action = TP_LOGDIR_KEEP; break;
        case 'd': action = TP_LOGDIR_DELETE; break;
        case 'b': action = TP_LOGDIR_BACKUP; break;
        case 'n': action = TP_LOGDIR_NEW; break;
        default:
            return tp_error(TP_ERR_INTERRUPTED, "log directory %s: quit", dir);
        }
    }
    switch (action) {
    case TP_LOGDIR_KEEP:
        return s_copy_out(out, size, dir);
    case TP_LOGDIR_DELETE:
        if (nftw(dir, s_rm, 16, FTW_DEPTH | FTW_PHYS) != 0)
            return tp_error(TP_ERR_IO, "deleting %s: %s", dir, strerror(errno));
        TP_INFO("deleted the old log directory %s", dir);
        TP_TRY(tp_mkdirs(dir));
        return s_copy_out(out, size, dir);
    case TP_LOGDIR_BACKUP: {
        char bak[4200];
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%m%d-%H%M%S", &tm);
        snprintf(bak, sizeof bak, "%s.%s", dir, stamp);
        for (int i = 1; access(bak, F_OK) == 0; i++)
            snprintf(bak, sizeof bak, "%s.%s-%d", dir, stamp, i);
        if (rename(dir, bak) != 0)
            return tp_error(TP_ERR_IO, "backing up %s to %s: %s", dir, bak, strerror(errno));
        TP_INFO("moved the old log directory %s to %s", dir, bak);
        TP_TRY(tp_mkdirs(dir));
        return s_copy_out(out, size, dir);
    }
    case TP_LOGDIR_NEW: {
        char next[4200];
        for (int i = 1; i < 10000; i++) {
            snprintf(next, sizeof next, "%s-%d", dir, i);
            if (access(next, F_OK) != 0) {
                TP_TRY(tp_mkdirs(next));
                TP_INFO("log directory %s exists: using %s", dir, next);
                return s_copy_out(out, size, next);
            }
        }
        return tp_error(TP_ERR_IO, "no free name after %s-9999", dir);
    }
    default:
        return tp_error(TP_ERR_INVALID, "log directory action %d", (int)action);
    }
}
