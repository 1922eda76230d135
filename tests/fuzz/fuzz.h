/* Shared by the fuzz harnesses (tests/fuzz/fuzz_*.c): the libFuzzer entry
 * point they define and a check that aborts, so that libFuzzer (or the
 * replay driver under ctest) reports a broken property as a crash. */
#ifndef MOEJIT_FUZZ_H
#define MOEJIT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A property of the library that must hold for every input. Harness code
 * may abort: only the library must never. */
#define FUZZ_REQUIRE(cond, ...)                                                           \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "fuzz: property failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fputc('\n', stderr);                                                                \
      abort();                                                                            \
    }                                                                                     \
  } while (0)

#endif
