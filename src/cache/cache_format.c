/* The bytes on disk: cache key derivation and the entry file format
 * (encode on store, full validation on read). MJ_CACHE_FORMAT_VERSION
 * covers everything in this file. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/cache.h"
#include "common/common.h"

/* ---- little-endian helpers ---------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* ---- key ------------------------------------------------------------------ */

/* Each field is its u64 little-endian length then its bytes, so no two
 * different field lists hash the same byte stream. */
static void key_field(XXH3_state_t *st, const void *data, size_t len) {
  unsigned char n[8];
  put_u64(n, (uint64_t)len);
  XXH3_128bits_update(st, n, sizeof n);
  if (len) XXH3_128bits_update(st, data, len);
}

static void key_field_u32(XXH3_state_t *st, uint32_t v) {
  unsigned char b[4];
  put_u32(b, v);
  key_field(st, b, sizeof b);
}

static void hash_to_hex(XXH128_hash_t h, char out[33]) {
  static const char digits[] = "0123456789abcdef";
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  for (int i = 0; i < 16; i++) {
    out[2 * i] = digits[c.digest[i] >> 4];
    out[2 * i + 1] = digits[c.digest[i] & 15];
  }
  out[32] = '\0';
}

void mj_cache_key_versioned(uint32_t format_version, const char *source, size_t source_len,
                            const char *options, int nvrtc_major, int nvrtc_minor, const char *arch,
                            char key_out[33]) {
  static const char domain[] = "moejit cubin cache key";
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  key_field(&st, domain, sizeof domain - 1);
  key_field_u32(&st, format_version);
  key_field(&st, source ? source : "", source ? source_len : 0);
  key_field(&st, options ? options : "", options ? strlen(options) : 0);
  key_field_u32(&st, (uint32_t)nvrtc_major);
  key_field_u32(&st, (uint32_t)nvrtc_minor);
  key_field(&st, arch ? arch : "", arch ? strlen(arch) : 0);
  hash_to_hex(XXH3_128bits_digest(&st), key_out);
}

void mj_cache_key(const char *source, size_t source_len, const char *options, int nvrtc_major,
                  int nvrtc_minor, const char *arch, char key_out[33]) {
  mj_cache_key_versioned(MJ_CACHE_FORMAT_VERSION, source, source_len, options, nvrtc_major,
                         nvrtc_minor, arch, key_out);
}

int mj_cache_key_valid(const char *key) {
  if (!key) return 0;
  for (int i = 0; i < 32; i++) {
    char ch = key[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return 0;
  }
  return key[32] == '\0';
}

moejit_status mj_cache_entry_path(const char *root, const char *key, char *buf, size_t cap) {
  if (!mj_cache_key_valid(key))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT,
                   "invalid cache key '%s' (want 32 lowercase hex digits)", key ? key : "(null)");
  return mj_snprintf(buf, cap, "%s/%.2s/%s.mjc", root, key, key);
}

/* ---- encoding ------------------------------------------------------------- */

/* Header field offsets (docs/cache.md). */
enum {
  OFF_MAGIC = 0,
  OFF_VERSION = 8,
  OFF_HEADER_BYTES = 12,
  OFF_PAYLOAD_BYTES = 16,
  OFF_META_BYTES = 24,
  OFF_CREATED = 32,
  OFF_CHECKSUM = 40,
  OFF_KEY = 56
};
_Static_assert(OFF_KEY + 32 == MJ_CACHE_HEADER_BYTES, "header layout and size disagree");

static size_t put_meta_string(unsigned char *p, const char *s, size_t field_cap) {
  size_t n = strnlen(s, field_cap - 1);
  put_u32(p, (uint32_t)n);
  memcpy(p + 4, s, n);
  return 4 + n;
}

static size_t encode_meta(const mj_cache_meta *meta, unsigned char *p) {
  static const mj_cache_meta empty;
  if (!meta) meta = &empty;
  size_t n = put_meta_string(p, meta->kernel, sizeof meta->kernel);
  n += put_meta_string(p + n, meta->arch, sizeof meta->arch);
  n += put_meta_string(p + n, meta->summary, sizeof meta->summary);
  return n;
}

static void checksum(const void *meta, size_t meta_len, const void *payload, size_t len,
                     unsigned char out[16]) {
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, meta, meta_len);
  XXH3_128bits_update(&st, payload, len);
  XXH128_canonicalFromHash((XXH128_canonical_t *)out, XXH3_128bits_digest(&st));
}

size_t mj_cache_encode_head(const char *key, const mj_cache_meta *meta, const void *payload,
                            size_t len, int64_t created, unsigned char *buf, size_t cap) {
  _Static_assert(sizeof(mj_cache_meta) + 12 <= MJ_CACHE_META_MAX, "metadata limit too small");
  if (cap < MJ_CACHE_HEADER_BYTES + MJ_CACHE_META_MAX || !mj_cache_key_valid(key)) return 0;
  unsigned char *m = buf + MJ_CACHE_HEADER_BYTES;
  size_t meta_len = encode_meta(meta, m);
  memset(buf, 0, MJ_CACHE_HEADER_BYTES);
  memcpy(buf + OFF_MAGIC, MJ_CACHE_MAGIC, 8); /* includes the NUL */
  put_u32(buf + OFF_VERSION, MJ_CACHE_FORMAT_VERSION);
  put_u32(buf + OFF_HEADER_BYTES, MJ_CACHE_HEADER_BYTES);
  put_u64(buf + OFF_PAYLOAD_BYTES, (uint64_t)len);
  put_u64(buf + OFF_META_BYTES, (uint64_t)meta_len);
  put_u64(buf + OFF_CREATED, (uint64_t)created);
  checksum(m, meta_len, payload, len, buf + OFF_CHECKSUM);
  memcpy(buf + OFF_KEY, key, 32);
  return MJ_CACHE_HEADER_BYTES + meta_len;
}

/* ---- decoding ------------------------------------------------------------- */

typedef struct header {
  uint32_t version, header_bytes;
  uint64_t payload_bytes, meta_bytes;
  int64_t created;
  unsigned char checksum[16];
  char key[33];
} header;

/* Reads up to len bytes; returns bytes read (short only at end of file) or
 * -1 with errno set. */
static ssize_t read_full(int fd, void *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, (char *)buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    got += (size_t)n;
  }
  return (ssize_t)got;
}

static moejit_status damaged(const char *path, const char *why) {
  return mj_fail(MOEJIT_ERR_CACHE, "cache entry '%s' is damaged: %s", path, why);
}

static moejit_status parse_header(const char *path, const unsigned char *b, uint64_t file_bytes,
                                  header *h) {
  char why[160];
  if (memcmp(b + OFF_MAGIC, MJ_CACHE_MAGIC, 8) != 0)
    return damaged(path, "not a moejit cache entry (bad magic)");
  h->version = get_u32(b + OFF_VERSION);
  if (h->version != MJ_CACHE_FORMAT_VERSION) {
    snprintf(why, sizeof why, "format version %u, this build reads version %u", h->version,
             (unsigned)MJ_CACHE_FORMAT_VERSION);
    return damaged(path, why);
  }
  h->header_bytes = get_u32(b + OFF_HEADER_BYTES);
  h->payload_bytes = get_u64(b + OFF_PAYLOAD_BYTES);
  h->meta_bytes = get_u64(b + OFF_META_BYTES);
  h->created = (int64_t)get_u64(b + OFF_CREATED);
  memcpy(h->checksum, b + OFF_CHECKSUM, 16);
  memcpy(h->key, b + OFF_KEY, 32);
  h->key[32] = '\0';
  if (h->header_bytes != MJ_CACHE_HEADER_BYTES) return damaged(path, "wrong header size");
  if (h->meta_bytes < 12 || h->meta_bytes > MJ_CACHE_META_MAX)
    return damaged(path, "metadata size out of range");
  if (h->payload_bytes == 0) return damaged(path, "empty payload");
  if (h->payload_bytes > file_bytes ||
      MJ_CACHE_HEADER_BYTES + h->meta_bytes + h->payload_bytes != file_bytes) {
    snprintf(why, sizeof why, "header says %llu bytes, the file has %llu (truncated?)",
             (unsigned long long)(MJ_CACHE_HEADER_BYTES + h->meta_bytes + h->payload_bytes),
             (unsigned long long)file_bytes);
    return damaged(path, why);
  }
  if (!mj_cache_key_valid(h->key)) return damaged(path, "stored key is not a key");
  return MOEJIT_OK;
}

static int get_meta_string(const unsigned char *m, size_t len, size_t *pos, char *out, size_t cap) {
  if (len - *pos < 4) return 0;
  uint32_t n = get_u32(m + *pos);
  *pos += 4;
  if (n >= cap || n > len - *pos || memchr(m + *pos, '\0', n)) return 0;
  memcpy(out, m + *pos, n);
  out[n] = '\0';
  *pos += n;
  return 1;
}

static int parse_meta(const unsigned char *m, size_t len, mj_cache_meta *meta) {
  size_t pos = 0;
  memset(meta, 0, sizeof *meta);
  return get_meta_string(m, len, &pos, meta->kernel, sizeof meta->kernel) &&
         get_meta_string(m, len, &pos, meta->arch, sizeof meta->arch) &&
         get_meta_string(m, len, &pos, meta->summary, sizeof meta->summary) && pos == len;
}

/* Hashes the payload into `st`, keeping it in `dest` if non-NULL, else
 * streaming it through a bounded chunk buffer. */
static moejit_status read_payload(int fd, const char *path, uint64_t len, XXH3_state_t *st,
                                  unsigned char *dest) {
  unsigned char chunk[1 << 16];
  for (uint64_t done = 0; done < len;) {
    size_t want = len - done < sizeof chunk ? (size_t)(len - done) : sizeof chunk;
    unsigned char *to = dest ? dest + done : chunk;
    ssize_t n = read_full(fd, to, want);
    if (n < 0) return mj_fail(MOEJIT_ERR_IO, "cannot read '%s': %s", path, strerror(errno));
    if ((size_t)n != want) return damaged(path, "file shrank while reading (truncated payload)");
    XXH3_128bits_update(st, to, want);
    done += want;
  }
  return MOEJIT_OK;
}

/* Header, metadata and payload of an open entry; fills head as it goes. */
static moejit_status read_open_entry(int fd, const char *path, const char *key,
                                     mj_cache_entry_head *head, void **data, size_t *len) {
  unsigned char hb[MJ_CACHE_HEADER_BYTES], mb[MJ_CACHE_META_MAX];
  header h;
  if (head->file_bytes < MJ_CACHE_HEADER_BYTES) return damaged(path, "truncated header");
  if (read_full(fd, hb, sizeof hb) != (ssize_t)sizeof hb)
    return damaged(path, "cannot read the header");
  moejit_status st = parse_header(path, hb, head->file_bytes, &h);
  if (st != MOEJIT_OK) return st;
  if (read_full(fd, mb, (size_t)h.meta_bytes) != (ssize_t)h.meta_bytes)
    return damaged(path, "truncated metadata");
  if (!parse_meta(mb, (size_t)h.meta_bytes, &head->meta)) return damaged(path, "bad metadata");
  head->created = h.created;
  head->header_ok = 1;
  if (key && strcmp(h.key, key) != 0) return damaged(path, "holds another key");
  if (h.payload_bytes > SIZE_MAX) return damaged(path, "payload too large");
  unsigned char *payload = NULL;
  if (data && !(payload = malloc((size_t)h.payload_bytes)))
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory reading cache entry '%s'", path);
  XXH3_state_t xs;
  XXH3_128bits_reset(&xs);
  XXH3_128bits_update(&xs, mb, (size_t)h.meta_bytes);
  st = read_payload(fd, path, h.payload_bytes, &xs, payload);
  unsigned char sum[16];
  XXH128_canonicalFromHash((XXH128_canonical_t *)sum, XXH3_128bits_digest(&xs));
  if (st == MOEJIT_OK && memcmp(sum, h.checksum, 16) != 0)
    st = damaged(path, "checksum mismatch (corrupt payload or metadata)");
  if (st != MOEJIT_OK) {
    free(payload);
    return st;
  }
  if (data) {
    *data = payload;
    *len = (size_t)h.payload_bytes;
  }
  return MOEJIT_OK;
}

moejit_status mj_cache_read_entry(const char *path, const char *key, mj_cache_entry_head *head,
                                  void **data, size_t *len) {
  mj_cache_entry_head local;
  if (!head) head = &local;
  memset(head, 0, sizeof *head);
  if (data) *data = NULL;
  if (len) *len = 0;
  /* O_NONBLOCK: a FIFO with an entry's name must not block the open (it is
   * then rejected below as not a regular file); regular files ignore it. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return mj_fail(MOEJIT_ERR_NOT_FOUND, "no cache entry '%s'", path);
  if (fd < 0 && errno == ELOOP) return damaged(path, "a symbolic link, not an entry");
  if (fd < 0) return mj_fail(MOEJIT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  moejit_status st;
  if (fstat(fd, &sb) != 0) {
    st = mj_fail(MOEJIT_ERR_IO, "cannot stat '%s': %s", path, strerror(errno));
  } else if (!S_ISREG(sb.st_mode)) {
    st = damaged(path, "not a regular file");
  } else {
    head->file_bytes = (uint64_t)sb.st_size;
    head->dev = (uint64_t)sb.st_dev;
    head->ino = (uint64_t)sb.st_ino;
    st = read_open_entry(fd, path, key, head, data, len);
  }
  close(fd);
  return st;
}
