/* towerpack dataflow/image: stb_image (Debian's libstb-dev), compiled here
 * with only its BMP and PNM readers, reading from memory, for
 * img_formats.c. A file of its own because stb_image is not written for
 * -Wall -Wextra: its warnings are off for this file alone, including the
 * ones GCC gives at the end of the file (static functions declared and
 * never defined), which a pragma pushed and popped around the #include
 * would not cover. */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include <stdint.h>
#include <stdlib.h>
#include "dataflow/image/img_formats.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_BMP
#define STBI_ONLY_PNM
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
/* the caller's pixel limit is checked before; this is stb's own bound */
#define STBI_MAX_DIMENSIONS (1 << 24)
#include <stb/stb_image.h>

uint8_t *img_stb_load(const uint8_t *p, int n, int req, int *w, int *h,
                      const char **why) {
    int comp = 0;
    uint8_t *px = stbi_load_from_memory(p, n, w, h, &comp, req);
    *why = px ? NULL : stbi_failure_reason();
    return px;
}

void img_stb_free(void *px) { stbi_image_free(px); }
