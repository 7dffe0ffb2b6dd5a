/* towerpack core: clocks. */
#include <time.h>
#include <towerpack/clock.h>

uint64_t tp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double tp_now_s(void) { return (double)tp_now_ns() * 1e-9; }

double tp_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
