/* towerpack models: the data sources the zoo's models can read, named the
 * way tp-train and tp-predict take them, turned into pipeline specs that
 * yield the zoo's inputs. One place, so both tools accept the same names. */
#include <stdio.h>
#include <string.h>
#include <towerpack/models.h>

static int s_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

tp_status_t tp_zoo_source(const char *data, int in_order, char *buf, size_t size) {
    if (!data)
        return tp_error(TP_ERR_INVALID, "no data source");
    /* sources whose order is random unless told: keep the file's order */
    const char *order = in_order && !strstr(data, "shuffle") ? ",shuffle=0" : "";
    int n;
    if (s_prefix(data, "fashion-mnist:") || s_prefix(data, "idx:"))
        n = snprintf(buf, size, "%s%s", data, order);
    else if (s_prefix(data, "lmdb:"))  /* record files are read in order */
        n = snprintf(buf, size, "%s", data);
    else if (s_prefix(data, "tensorpack-lmdb:"))  /* numpy's int64 labels */
        n = snprintf(buf, size, "%s,int32", data);
    else if (s_prefix(data, "imagefolder:") || s_prefix(data, "imagelist:"))
        /* grey, decoded at the smallest JPEG scale that keeps 28 pixels on
         * the short side, then resized to the models' 28x28 */
        n = snprintf(buf, size, "%s%s,mode=grey,min-short=28 | imgaug resize=28x28",
                     data, order);
    else
        return tp_error(TP_ERR_INVALID, "data source '%s': use fashion-mnist:SPLIT, "
                        "idx:IMAGES[,LABELS], lmdb:PATH, tensorpack-lmdb:PATH, "
                        "imagefolder:DIR or imagelist:FILE", data);
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "data source '%.64s...': too long", data);
    return TP_OK;
}
