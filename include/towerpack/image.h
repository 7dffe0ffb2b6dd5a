/* towerpack: images (dataflow/image/): JPEG, PNG, WebP, TIFF, BMP and
 * PGM/PPM decoding (the formats of torchvision's ImageFolder), image-folder,
 * list-file, encoded-record and CIFAR sources, and tensorpack's image
 * augmentors (imgaug) beyond the four of dataflow_lib.h.
 *
 * Images are uint8 tensors, [H,W] for grey (as the IDX sources yield) and
 * [H,W,C] for RGB (C 3) and RGBA (C 4), row-major, channels interleaved.
 * JPEG is decoded by libjpeg-turbo (TurboJPEG API), PNG by libpng, WebP by
 * libwebp, TIFF by libtiff, BMP and PGM/PPM by stb_image; the file type
 * comes from the bytes (magic), never from the file name (docs/images.md
 * says what of each format is read and what is refused). */
#ifndef TOWERPACK_IMAGE_H
#define TOWERPACK_IMAGE_H

#include <towerpack/dataflow_lib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- decoding ------------------------------------------------------------- */

/* Channels wanted: as stored (grey stays grey, colour becomes RGB, any alpha
 * RGBA), or converted to grey / RGB / RGBA. */
typedef enum tp_image_mode {
    TP_IMAGE_ANY = 0,
    TP_IMAGE_GREY = 1,
    TP_IMAGE_RGB = 3,
    TP_IMAGE_RGBA = 4
} tp_image_mode_t;

typedef struct tp_image_opts {
    tp_image_mode_t mode;  /* TP_IMAGE_ANY */
    /* JPEG only: decode at the smallest DCT scale (1/8, 1/4, 1/2 or 1, as
     * PIL's draft mode) whose result is still at least min_short pixels on
     * its short side (0: full size). A later resize to that size then reads
     * 4 to 64 times fewer pixels. (libjpeg-turbo's other eighths are slower
     * than the whole decode: not used.) */
    int min_short;
    int exif;              /* 1: apply a JPEG's EXIF orientation (default 0,
                            * as PIL's Image.open and torchvision) */
    int64_t max_pixels;    /* larger images are an error (default 1 << 26) */
} tp_image_opts_t;

/* Defaults: mode ANY, full size, EXIF orientation off, 64 Mpixel limit. */
void tp_image_opts_init(tp_image_opts_t *opts);

/* Decode an encoded image (untrusted bytes) into a new owned uint8 tensor
 * (*out). `name` (a path, may be NULL) is used in messages: TP_ERR_FORMAT
 * for a truncated, corrupt or unknown file, TP_ERR_SHAPE for one over
 * max_pixels, each naming the file. opts NULL: defaults. */
tp_status_t tp_image_decode(const void *data, size_t size,
                            const tp_image_opts_t *opts, const char *name,
                            tp_tensor_t *out);

/* Read and decode the file at `path` (TP_ERR_IO when it cannot be read). */
tp_status_t tp_image_read(const char *path, const tp_image_opts_t *opts,
                          tp_tensor_t *out);

/* A rectangle of an image, chosen once its decoded size (height x width,
 * after min_short's scaling and the EXIF rotation) is known: rect = {y, x,
 * h, w} (set to the whole image before the call). */
typedef void (*tp_image_pick_fn)(void *user, int height, int width, int rect[4]);

/* tp_image_decode / tp_image_read, but *out is only the rectangle `pick`
 * chooses: the pixels a whole decode has there, byte for byte. A JPEG is
 * decoded only over the rectangle's rows and columns and a margin of 32
 * pixels (libjpeg-turbo's cropping and skipping: what DALI's fused decode
 * and random crop saves); CMYK, EXIF-rotated JPEGs and the other formats
 * are decoded whole, then cut. Damage in a JPEG's rows below the band goes unseen. A
 * rectangle outside the image is TP_ERR_INVALID. */
tp_status_t tp_image_decode_region(const void *data, size_t size,
                                   const tp_image_opts_t *opts, const char *name,
                                   tp_image_pick_fn pick, void *user, tp_tensor_t *out);
tp_status_t tp_image_read_region(const char *path, const tp_image_opts_t *opts,
                                 tp_image_pick_fn pick, void *user, tp_tensor_t *out);

/* Encode a uint8 [H,W] or [H,W,3] image as JPEG of `quality` (1..100) into a
 * malloc'ed buffer the caller frees (the JPEG re-encode augmentor uses it). */
tp_status_t tp_image_encode_jpeg(const tp_tensor_t *img, int quality,
                                 void **data, size_t *size);

/* Encode a uint8 [H,W], [H,W,3] or [H,W,4] image as PNG (malloc'ed). */
tp_status_t tp_image_encode_png(const tp_tensor_t *img, void **data,
                                size_t *size);

/* Tile a batch of float32 images into one uint8 grid image [rows x (H +
 * pad) + pad, columns x (W + pad) + pad, C] (HWC, black between tiles):
 * the batch is [N, C, H, W] with C 1 or 3, or [N, H, W]; values in
 * [lo, hi] map to 0..255 (clamped; a NaN is 0). columns <= 0: the
 * smallest square that holds N. *grid is made (owned by the caller). */
tp_status_t tp_image_grid(const tp_tensor_t *batch, float lo, float hi, int columns,
                          int pad, tp_tensor_t *grid);

/* ---- sources ---------------------------------------------------------------- */

typedef struct tp_image_source_opts {
    tp_image_opts_t decode;  /* how the images are decoded */
    int shuffle;             /* reshuffle every pass (1) */
    int raw;                 /* 1: yield the file's bytes (uint8 [N]) undecoded,
                              * for records decoded later by `decode` */
    int skip_bad;            /* 1: skip (and count) files that fail to
                              * decode instead of failing the pass */
    /* crop_size > 0: a random resized crop to crop_size x crop_size as
     * imgaug random-resized-crop draws it (area crop_area[0..1] of the
     * image, aspect crop_ratio[0..1]; defaults 0.08-1, 0.75-1.333),
     * bilinear, drawn before decoding so only the crop is decoded
     * (tp_image_read_region). */
    int crop_size;
    double crop_area[2], crop_ratio[2];
} tp_image_source_opts_t;

void tp_image_source_opts_init(tp_image_source_opts_t *opts);

/* torchvision's ImageFolder: DIR/<class>/<file>, classes sorted by name
 * (strcmp) and numbered from 0; files of every sub-folder (recursively)
 * whose extension is an image's (torchvision's IMG_EXTENSIONS: .jpg .jpeg
 * .png .ppm .bmp .pgm .tif .tiff .webp, any case). Datapoints:
 * the image, the class as int32 scalar. The class table is written to the
 * log at INFO. opts NULL: defaults. */
tp_dataflow_t *tp_df_image_folder(const char *dir,
                                  const tp_image_source_opts_t *opts);

/* The classes of an image folder in label order (the sub-folders' names,
 * sorted as tp_df_image_folder numbers them: torchvision's ImageFolder
 * rule) into *names ([*n] malloc'ed strings in a malloc'ed array: free
 * each, then the array); first_image (may be NULL) gets the path of the
 * first image of the first class that has one ("" when none). */
tp_status_t tp_image_folder_classes(const char *dir, char ***names, int *n,
                                    char *first_image, size_t size);

/* What an image source holds, for a trainer that shapes its model from the
 * data. Held by value: tp_image_source_info_init / _fini. */
typedef struct tp_image_source_info {
    int channels;      /* the first image's: 1 grey, 3 colour (an RGBA image
                        * counts as 3: the sources decode it as RGB); an
                        * imagefolder whose first image is grey is colour
                        * if another class's first image is */
    int nclasses;      /* imagefolder: its class folders; imagelist: the
                        * largest label + 1; cifar: 10, 100 or 20 (coarse) */
    char **classes;    /* [nclasses] names in label order (a list file's
                        * labels and CIFAR-100 without its names file are
                        * named by their numbers) */
} tp_image_source_info_t;
void tp_image_source_info_init(tp_image_source_info_t *info);
void tp_image_source_info_fini(tp_image_source_info_t *info);
/* `source` a spec source: imagefolder:DIR[,..], imagelist:LIST[,root=..]
 * or cifar:FILE[,cifar100][,fine]. TP_ERR_UNSUPPORTED for another kind of
 * source; the source's own errors (a missing folder, a bad list line, the
 * first image not decodable) name the file. */
tp_status_t tp_image_source_info(const char *source, tp_image_source_info_t *info);

/* A list file as tensorpack's ILSVRC12Files: one "PATH LABEL" a line
 * (whitespace separated, the label a non-negative integer; '#' comments and
 * blank lines ignored), PATH relative to `root` (NULL: the list's folder). */
tp_dataflow_t *tp_df_image_list(const char *list_path, const char *root,
                                const tp_image_source_opts_t *opts);

/* Files that failed to decode and were skipped (skip_bad), by this
 * dataflow (an image folder or list) since it was made: distinct files (a
 * file found bad is skipped unread in later passes); -1 for another. */
int64_t tp_df_image_skipped(tp_dataflow_t *df);
/* The same summed over every image source of this process (what a forked
 * dataflow worker reports to its parent); -1 while none was reset here. */
int64_t tp_image_skipped_in_process(void);

/* The CIFAR-10 / CIFAR-100 binary format: `path` one .bin file (3073 or
 * 3074 bytes a record), `fine` 1 for CIFAR-100's fine label (else its
 * coarse label; ignored for CIFAR-10, told apart by `cifar100`). Datapoints:
 * uint8 [32,32,3] (HWC), int32 label. */
tp_dataflow_t *tp_df_cifar(const char *path, int cifar100, int fine,
                           int shuffle);

/* A map function decoding component `component` (uint8 [N] encoded bytes,
 * as `raw` sources and their LMDB records hold) in place, for tp_df_map or
 * a threaded map; user = a tp_image_decoder_t. */
typedef struct tp_image_decoder {
    tp_image_opts_t opts;
    int component;
} tp_image_decoder_t;
tp_status_t tp_image_decode_map(tp_datapoint_t **dp, tp_rng_t *rng,
                                void *user);

/* ---- augmentors (tensorpack's imgaug, on uint8 images) ----------------------- */

/* Interpolation of the geometric augmentors. */
typedef enum { TP_INTERP_NEAREST = 0, TP_INTERP_LINEAR = 1 } tp_interp_t;

/* Resize to exactly h x w (tensorpack Resize). */
tp_status_t tp_augment_add_resize(tp_augment_t *self, int h, int w,
                                  tp_interp_t interp);
/* Resize so the short side is `size`, keeping the aspect ratio
 * (ResizeShortestEdgeSize). */
tp_status_t tp_augment_add_resize_short(tp_augment_t *self, int size,
                                        tp_interp_t interp);
/* Resize the short side to a random integer in [lo, hi] (RandomResize with
 * aspect kept). */
tp_status_t tp_augment_add_random_resize_short(tp_augment_t *self, int lo,
                                               int hi, tp_interp_t interp);
/* Center crop h x w (CenterCrop); the image must be at least that. */
tp_status_t tp_augment_add_center_crop(tp_augment_t *self, int h, int w);
/* GoogLeNet-style random crop (GoogleNetRandomCropAndResize): try 10 times
 * an area in [area_lo, area_hi] of the image and aspect ratio in
 * [ratio_lo, ratio_hi] (log-uniform), then resize the crop to size x size;
 * failing that, resize the short side and center crop. */
tp_status_t tp_augment_add_random_resized_crop(tp_augment_t *self, int size,
                                               double area_lo, double area_hi,
                                               double ratio_lo,
                                               double ratio_hi,
                                               tp_interp_t interp);
/* Vertical flip with probability `prob` (Flip(vert=True)). */
tp_status_t tp_augment_add_vflip(tp_augment_t *self, double prob);
/* Brightness: add a uniform delta in [-delta, delta] (Brightness). */
tp_status_t tp_augment_add_brightness(tp_augment_t *self, double delta);
/* Brightness by a factor: x * r, r uniform in [lo, hi] (BrightnessScale;
 * torchvision's ColorJitter(brightness=b) is [1-b, 1+b]). */
tp_status_t tp_augment_add_brightness_scale(tp_augment_t *self, double lo,
                                           double hi);
/* Contrast: (x - mean) * r + mean, r uniform in [lo, hi], mean over the
 * image's grey value (Contrast). */
tp_status_t tp_augment_add_contrast(tp_augment_t *self, double lo, double hi);
/* Saturation: blend with the grey image, alpha uniform in [1-a, 1+a]
 * (Saturation, RGB). */
tp_status_t tp_augment_add_saturation(tp_augment_t *self, double alpha);
/* Hue: add U(lo, hi) to the hue in OpenCV's 8-bit HSV (0..179, so 90 is
 * half a turn) and convert back (Hue, rgb=True). */
tp_status_t tp_augment_add_hue(tp_augment_t *self, double lo, double hi);
/* Lighting: AlexNet PCA noise, std `std`, eigenvalues and eigenvectors of
 * RGB (Lighting; eigvec row-major [3][3], columns the vectors). */
tp_status_t tp_augment_add_lighting(tp_augment_t *self, double std,
                                    const float *eigval, const float *eigvec);
/* Grey-scale with probability `prob`, kept as 3 channels (Grayscale). */
tp_status_t tp_augment_add_grey(tp_augment_t *self, double prob);
/* Gaussian noise of std `sigma` added to every value (GaussianNoise). */
tp_status_t tp_augment_add_gaussian_noise(tp_augment_t *self, double sigma);

/* Clip every value to [lo, hi] (Clip). */
tp_status_t tp_augment_add_clip(tp_augment_t *self, int lo, int hi);
/* Stretch the image's own range onto [lo, hi] (MinMaxNormalize,
 * all_channel=True; the result rounded to uint8). */
tp_status_t tp_augment_add_min_max(tp_augment_t *self, int lo, int hi);
/* The same with each channel's own range (MinMaxNormalize,
 * all_channel=False). */
tp_status_t tp_augment_add_min_max_channels(tp_augment_t *self, int lo, int hi);
/* Each value becomes 255 with probability `white`, 0 with `black`
 * (SaltPepperNoise). */
tp_status_t tp_augment_add_salt_pepper(tp_augment_t *self, double white,
                                       double black);
/* JPEG re-encode at a quality drawn from [qlo, qhi) and decode (JpegNoise;
 * grey or RGB). */
tp_status_t tp_augment_add_jpeg_noise(tp_augment_t *self, int qlo, int qhi);

/* Rotate by U(-max_deg, max_deg) degrees about a centre drawn uniformly in
 * [lo, hi] of the width and height (Rotation; bilinear, border replicated,
 * the size kept). Points move by the same matrix. */
tp_status_t tp_augment_add_rotation(tp_augment_t *self, double max_deg,
                                    double center_lo, double center_hi);
/* Affine warp about the centre (Affine): scale from [scale[0], scale[1]]
 * (NULL: 1), a shift of up to translate_frac[0] of the width and [1] of the
 * height (NULL: none; rounded to whole pixels), rotation U(-max, max)
 * degrees and shear U(-shear, shear) degrees; bilinear, border replicated,
 * points moved by the same matrix. */
tp_status_t tp_augment_add_affine(tp_augment_t *self, const double *scale,
                                  const double *translate_frac,
                                  double rotate_max_deg, double shear);
/* Gaussian blur, window 2 k + 1 with k drawn from [size_lo, size_hi) and
 * sigma from [sigma_lo, sigma_hi] (0: OpenCV's default for the size)
 * (GaussianBlur, symmetric; border replicated). */
tp_status_t tp_augment_add_gaussian_blur(tp_augment_t *self, int size_lo,
                                         int size_hi, double sigma_lo,
                                         double sigma_hi);
/* Motion blur: a line kernel of odd length k drawn from the odd numbers in
 * [size_lo, size_hi] at an angle drawn from [deg_lo, deg_hi) degrees,
 * normalised, applied as cv2.filter2D with the border replicated. */
tp_status_t tp_augment_add_motion_blur(tp_augment_t *self, int size_lo,
                                       int size_hi, double deg_lo,
                                       double deg_hi);
/* (x - mean) / max(std, 1/sqrt(N)) over the whole image, to float32
 * (MeanVarianceNormalize, all_channel=True). */
tp_status_t tp_augment_add_mean_var(tp_augment_t *self);
/* The same with each channel's own mean and std (all_channel=False; the
 * floor on the std stays 1/sqrt(all values), as tensorpack's). */
tp_status_t tp_augment_add_mean_var_channels(tp_augment_t *self);

/* Channels first: an HWC image (uint8, or float32 after normalisation)
 * becomes CHW, the layout of the NCHW convolutions (tensorpack's models
 * transpose inside the graph instead); an HW image is left as it is. Put it
 * last, after the colour steps and the normalisation (they read HWC). */
tp_status_t tp_augment_add_to_chw(tp_augment_t *self);

/* Apply the chain *sub (taken; *sub nulled) with probability `prob`
 * (RandomApplyAug). */
tp_status_t tp_augment_add_random_apply(tp_augment_t *self, tp_augment_t **sub,
                                        double prob);
/* Apply one of the n chains subs[] (each taken and nulled), drawn uniformly
 * (RandomChooseAug). */
tp_status_t tp_augment_add_random_choice(tp_augment_t *self,
                                         tp_augment_t **subs, int n);
/* Apply all n chains subs[] (taken) in a random order (RandomOrderAug). */
tp_status_t tp_augment_add_random_order(tp_augment_t *self,
                                        tp_augment_t **subs, int n);

/* As tp_augment_apply_coords for boxes: float32 [N,4] (x1, y1, x2, y2),
 * each replaced by the bounding box of its four moved corners (tensorpack's
 * box_to_point4 / point8_to_box). */
tp_status_t tp_augment_apply_boxes(const tp_augment_t *self, tp_tensor_t *t,
                                   tp_tensor_t *boxes, tp_rng_t *rng);

#ifdef __cplusplus
}
#endif
#endif
