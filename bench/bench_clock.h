/* Wall-clock milliseconds for the benchmark programs (CLOCK_MONOTONIC; the
 * programs link only the public library, so they do not share its
 * internal clock). Needs _POSIX_C_SOURCE >= 199309L before the first include. */
#ifndef MOEJIT_BENCH_CLOCK_H
#define MOEJIT_BENCH_CLOCK_H

#include <time.h>

static inline double bench_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
