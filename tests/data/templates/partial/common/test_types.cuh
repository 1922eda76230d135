// Test-only shared header: types and a compile-time check of the prelude.
#pragma once

static_assert(kTopK >= 1 && kTopK <= kExperts, "prelude: top-k within experts");
static_assert(kBlockThreads % 32 == 0, "prelude: whole warps");
static_assert(kTopkGroup <= kNumGroups, "prelude: groups");

struct TestChoice {
  float weight;
  int expert;
};
