/* towerpack dataflow: the helpers a spec factory parses its arguments with
 * (integers, numbers, key=value lists). They sit apart from the parser and
 * its registry (df_spec.c) because factories in other files (the image
 * sources, dataflow/image/img_spec.c) use them while the registry names
 * those factories: helpers <- factories <- registry, one way. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <towerpack/dataflow_spec.h>
#include "df_internal.h"

tp_status_t tp_spec_int(const char *text, int64_t lo, int64_t hi,
                        const char *what, int64_t *out) {
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || errno || *end || v < lo || v > hi)
        return tp_error(TP_ERR_INVALID, "%s: '%s' is not an integer in "
                        "[%" PRId64 ", %" PRId64 "]", what,
                        text ? text : "", lo, hi);
    *out = v;
    return TP_OK;
}

tp_status_t tp_spec_double(const char *text, const char *what, double *out) {
    char *end;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || errno || *end || !isfinite(v))
        return tp_error(TP_ERR_INVALID, "%s: '%s' is not a number", what,
                        text ? text : "");
    *out = v;
    return TP_OK;
}

char *df_spec_trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

tp_status_t tp_spec_foreach_kv(const char *args,
                               tp_status_t (*fn)(const char *key,
                                                 const char *value,
                                                 void *ctx),
                               void *ctx) {
    char *copy = strdup(args ? args : "");
    if (!copy)
        return tp_error(TP_ERR_NOMEM, "spec");
    tp_status_t rc = TP_OK;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item && rc == TP_OK;
         item = strtok_r(NULL, ",", &save)) {
        item = df_spec_trim(item);
        if (!*item)
            continue;
        char *eq = strchr(item, '=');
        char *value = NULL;
        if (eq) {
            *eq = '\0';
            value = df_spec_trim(eq + 1);
            item = df_spec_trim(item);
        }
        rc = fn(item, value, ctx);
    }
    free(copy);
    return rc;
}
