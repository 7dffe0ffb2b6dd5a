/* towerpack: monotonic time. */
#ifndef TOWERPACK_CLOCK_H
#define TOWERPACK_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic nanoseconds since an arbitrary start. */
uint64_t tp_now_ns(void);
/* Monotonic seconds, as a double. */
double tp_now_s(void);
/* Wall-clock seconds since the epoch (for logs and stats.json). */
double tp_wall_s(void);

#ifdef __cplusplus
}
#endif
#endif
