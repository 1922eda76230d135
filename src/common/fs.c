/* File helpers: whole-file reads, atomic writes (temp + fsync + rename),
 * mkdir -p. Every failure names the path and the system's reason. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

moejit_status mj_read_file(const char *path, char **data, size_t *len) {
  /* O_NONBLOCK: a FIFO without a writer must not block the open; it is
   * refused below as not a regular file. Regular files ignore the flag. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return mj_fail(MOEJIT_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return mj_fail(MOEJIT_ERR_IO, "cannot read '%s': %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return mj_fail(MOEJIT_ERR_IO, "cannot read '%s': %s", path,
                   S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file");
  }
  mj_buf b = {0};
  char chunk[65536];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      mj_buf_free(&b);
      return mj_fail(MOEJIT_ERR_IO, "cannot read '%s': %s", path, strerror(e));
    }
    if (n == 0) break;
    mj_buf_append(&b, chunk, (size_t)n);
  }
  close(fd);
  if (b.oom) {
    mj_buf_free(&b);
    return mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
  }
  *len = b.len;
  *data = mj_buf_take(&b);
  return *data ? MOEJIT_OK : mj_fail(MOEJIT_ERR_OUT_OF_MEMORY, "out of memory reading '%s'", path);
}

static int write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

moejit_status mj_write_file_atomic(const char *path, const void *data, size_t len) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.XXXXXX", path, (long)getpid()) >= (int)sizeof tmp)
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "path too long: '%s'", path);
  int fd = mkstemp(tmp);
  if (fd < 0) return mj_fail(MOEJIT_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
  if (write_all(fd, data, len) != 0 || fsync(fd) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp);
    return mj_fail(MOEJIT_ERR_IO, "cannot write '%s': %s", path, strerror(e));
  }
  if (fchmod(fd, 0644) != 0) { /* mkstemp made it 0600; best effort */
  }
  if (close(fd) != 0 || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return mj_fail(MOEJIT_ERR_IO, "cannot write '%s': %s", path, strerror(e));
  }
  return MOEJIT_OK;
}

moejit_status mj_mkdir_p(const char *path, int mode) {
  char buf[4096];
  if (!mj_strlcpy(buf, path, sizeof buf))
    return mj_fail(MOEJIT_ERR_INVALID_ARGUMENT, "path too long: '%s'", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
      return mj_fail(MOEJIT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
    *p = '/';
  }
  if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
    return mj_fail(MOEJIT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
  struct stat st;
  if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
    return mj_fail(MOEJIT_ERR_IO, "'%s' exists and is not a directory", buf);
  return MOEJIT_OK;
}
