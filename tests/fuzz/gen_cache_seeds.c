/* Writes the seed corpus of fuzz_cache_entry (tests/fuzz/corpus/cache_entry)
 * with the library's own encoder: good entries, each kind of damage, and
 * round-trip descriptors. Re-run after a cache format change:
 *   build/tests/fuzz/fuzz_gen_cache_seeds tests/fuzz/corpus/cache_entry */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"

static const char *out_dir;

/* Writes mode byte + body to OUT/name. */
static void seed(const char *name, unsigned char mode, const void *body, size_t len) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", out_dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(&mode, 1, 1, f) != 1 || (len && fwrite(body, 1, len, f) != len)) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  fclose(f);
}

/* An encoded entry: header + metadata + payload, in a malloc'd buffer. */
static unsigned char *entry(const char *key, const char *kernel, const char *summary,
                            const unsigned char *payload, size_t len, size_t *out_len) {
  mj_cache_meta meta;
  memset(&meta, 0, sizeof meta);
  snprintf(meta.kernel, sizeof meta.kernel, "%s", kernel);
  snprintf(meta.arch, sizeof meta.arch, "sm_90a");
  snprintf(meta.summary, sizeof meta.summary, "%s", summary);
  unsigned char *buf = malloc(MJ_CACHE_HEADER_BYTES + MJ_CACHE_META_MAX + len);
  if (!buf) exit(1);
  size_t head = mj_cache_encode_head(key, &meta, payload, len, 1700000000, buf,
                                     MJ_CACHE_HEADER_BYTES + MJ_CACHE_META_MAX);
  if (!head) exit(1);
  memcpy(buf + head, payload, len);
  *out_len = head + len;
  return buf;
}

static void good_and_damaged(const char *key) {
  unsigned char payload[2048];
  memcpy(payload,
         "\x7f"
         "ELF\x02\x01\x01",
         7); /* looks like a cubin */
  for (size_t i = 7; i < sizeof payload; i++) payload[i] = (unsigned char)(i * 37u + 11u);
  size_t n;
  unsigned char *e =
      entry(key, "gemm1", "qwen3-30b-a3b d=2048 f=768 E=128 k=8 softmax bf16", payload, 2048, &n);
  seed("raw_good_2k", 0, e, n);
  seed("repaired_good_2k", 1, e, n);
  seed("raw_truncated_header", 0, e, 40);
  seed("raw_truncated_payload", 0, e, n - 100);
  e[8] = 2; /* another format version */
  seed("raw_other_version", 0, e, n);
  e[8] = 1;
  e[n - 1] ^= 0x40; /* checksum mismatch */
  seed("raw_flipped_payload", 0, e, n);
  e[n - 1] ^= 0x40;
  e[24] = 0xff; /* metadata size out of range */
  seed("raw_meta_size", 0, e, n);
  seed("repaired_meta_size", 1, e, n);
  free(e);
  e = entry(key, "route", "", (const unsigned char *)"x", 1, &n);
  seed("raw_good_1byte", 0, e, n);
  seed("repaired_good_1byte", 1, e, n);
  free(e);
  char long_summary[192];
  memset(long_summary, 's', sizeof long_summary - 1);
  long_summary[sizeof long_summary - 1] = '\0';
  e = entry(key, "combine", long_summary, payload, 100, &n);
  seed("raw_good_long_summary", 0, e, n);
  free(e);
  seed("raw_foreign", 0, "not a cache entry at all\n", 25);
  seed("raw_empty", 0, "", 0);
}

static void round_trips(void) {
  /* cut (2 bytes), flip, then kernel, arch, summary (length byte + text),
   * then the payload */
  static const unsigned char a[] = {0x40, 0x00, 0x07, 5,   'g', 'e', 'm', 'm', '2', 6,
                                    's',  'm',  '_',  '9', '0', 'a', 3,   'a', 'b', 'c',
                                    1,    2,    3,    4,   5,   6,   7,   8};
  seed("round_trip_small", 2, a, sizeof a);
  static const unsigned char b[] = {0xff, 0xff, 0x00, 0, 0, 0, 'p'};
  seed("round_trip_empty_meta", 2, b, sizeof b);
  static const unsigned char c[] = {0x10, 0x00, 0x55, 2, 'a', 0, 0};
  seed("round_trip_no_payload", 2, c, sizeof c);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  char key[33];
  mj_cache_key("seed kernel", 11, "-arch=sm_90a", 12, 8, "sm_90a", key);
  good_and_damaged(key);
  round_trips();
  return 0;
}
