/* towerpack models: what the zoo's models read, in one place for every
 * tool: the data sources (named the way tp-train and tp-predict take them,
 * turned into pipeline specs that yield the zoo's inputs) and the
 * checkpoints (the model a checkpoint records, for tp-predict, tp-export
 * and tp-bench predict). */
#include <stdio.h>
#include <string.h>
#include <towerpack/models.h>
#include <towerpack/predict.h>

static int s_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

tp_status_t tp_zoo_source_sized(const char *data, int in_order, int height, int width,
                                char *buf, size_t size) {
    if (!data)
        return tp_error(TP_ERR_INVALID, "no data source");
    if (height < 1 || height > TP_ZOO_MAX_SIZE || width < 1 || width > TP_ZOO_MAX_SIZE)
        return tp_error(TP_ERR_INVALID, "data source '%s': image size %dx%d (height "
                        "and width 1..%d)", data, height, width, TP_ZOO_MAX_SIZE);
    /* sources whose order is random unless told: keep the file's order */
    const char *order = in_order && !strstr(data, "shuffle") ? ",shuffle=0" : "";
    /* the 28x28 records resized in the pipeline (tensorpack's imgaug.Resize
     * in an AugmentImageComponent): nothing to add at their own size */
    char resize[64] = "";
    if (height != 28 || width != 28)
        snprintf(resize, sizeof resize, " | imgaug resize=%dx%d", height, width);
    int n;
    if (s_prefix(data, "fashion-mnist:") || s_prefix(data, "idx:"))
        n = snprintf(buf, size, "%s%s%s", data, order, resize);
    else if (s_prefix(data, "lmdb:"))  /* record files are read in order */
        n = snprintf(buf, size, "%s%s", data, resize);
    else if (s_prefix(data, "tensorpack-lmdb:"))  /* numpy's int64 labels */
        n = snprintf(buf, size, "%s,int32%s", data, resize);
    else if (s_prefix(data, "imagefolder:") || s_prefix(data, "imagelist:"))
        /* grey, decoded at the smallest JPEG scale that keeps the short
         * side of the model's input, then resized to it */
        n = snprintf(buf, size, "%s%s,mode=grey,min-short=%d | imgaug resize=%dx%d",
                     data, order, height < width ? height : width, height, width);
    else
        return tp_error(TP_ERR_INVALID, "data source '%s': use fashion-mnist:SPLIT, "
                        "idx:IMAGES[,LABELS], lmdb:PATH, tensorpack-lmdb:PATH, "
                        "imagefolder:DIR or imagelist:FILE", data);
    if (n < 0 || (size_t)n >= size)
        return tp_error(TP_ERR_INVALID, "data source '%.64s...': too long", data);
    return TP_OK;
}

tp_status_t tp_zoo_source(const char *data, int in_order, char *buf, size_t size) {
    return tp_zoo_source_sized(data, in_order, 28, 28, buf, size);
}

const tp_zoo_model_t *tp_zoo_from_checkpoint(const char *load, const char *model,
                                             char *ckpt, size_t size,
                                             tp_input_desc_t inputs[2]) {
    tp_checkpoint_info_t info;
    if (tp_checkpoint_resolve(load, ckpt, size) < 0 || tp_checkpoint_info(ckpt, &info) < 0)
        return NULL;
    const char *name = model ? model : info.model;
    if (!*name) {
        tp_error(TP_ERR_INVALID, "%s does not record its model (written before "
                 "tp-train recorded it): give --model (mlp, cnn, cnn-bn, resnet)", ckpt);
        return NULL;
    }
    const tp_zoo_model_t *zoo = tp_zoo_find(name);
    if (!zoo)
        return NULL;
    memcpy(inputs, tp_zoo_inputs(), 2 * sizeof *inputs);
    const tp_input_desc_t *rec = info.ninputs > 0 && !strcmp(info.inputs[0].name, "image")
                               ? &info.inputs[0] : NULL;
    if (rec) {
        /* the size it was trained at: [batch,height,width] */
        if (rec->ndim != 3 || rec->shape[1] > TP_ZOO_MAX_SIZE ||
            rec->shape[2] > TP_ZOO_MAX_SIZE) {
            tp_error(TP_ERR_FORMAT, "%s: the recorded image input is not [batch,"
                     "height,width] with sides up to %d", ckpt, TP_ZOO_MAX_SIZE);
            return NULL;
        }
        inputs[0].shape[1] = rec->shape[1];
        inputs[0].shape[2] = rec->shape[2];
    }
    if (tp_zoo_check_size(zoo, (int)inputs[0].shape[1], (int)inputs[0].shape[2]) != TP_OK) {
        tp_error_wrap(TP_ERR_INVALID, "%s", ckpt);
        return NULL;
    }
    /* the image dtype it was trained on: float32 after the augmentor */
    if (rec)
        inputs[0].dtype = rec->dtype;
    else
        inputs[0].dtype = zoo->augment ? TP_FLOAT32 : TP_UINT8;
    return zoo;
}
