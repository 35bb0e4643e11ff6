// An LD_PRELOAD library that counts a process's heap allocations, for the per-message allocation
// counts in docs/benchmarks.md ("The per-step overhead"). Counts every call of malloc, calloc,
// realloc, memalign, posix_memalign, aligned_alloc, valloc and pvalloc (frees are not counted) and
// writes the total to the file named by $ATTNSERVE_MALLOC_COUNT_FILE when the process exits
// normally (the server does on SIGTERM). Counts, not bytes or time: the wrappers add an atomic
// increment to each call and forward to glibc's own allocator (__libc_malloc and friends, which
// glibc exports for exactly this), so no dlsym bootstrap is needed.
//
// Usage (the full command is in docs/benchmarks.md):
//   ATTNSERVE_MALLOC_COUNT_FILE=/tmp/count
//   LD_PRELOAD=build/tests/benchmarks/libmalloc_counter.so build/server/attnserve_server ...
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void* __libc_malloc(size_t size);
extern void* __libc_calloc(size_t count, size_t size);
extern void* __libc_realloc(void* ptr, size_t size);
extern void* __libc_memalign(size_t alignment, size_t size);
extern void* __libc_valloc(size_t size);
extern void* __libc_pvalloc(size_t size);

static atomic_ullong allocations;

static void Count(void) { atomic_fetch_add_explicit(&allocations, 1, memory_order_relaxed); }

void* malloc(size_t size) {
  Count();
  return __libc_malloc(size);
}

void* calloc(size_t count, size_t size) {
  Count();
  return __libc_calloc(count, size);
}

void* realloc(void* ptr, size_t size) {
  Count();
  return __libc_realloc(ptr, size);
}

void* memalign(size_t alignment, size_t size) {
  Count();
  return __libc_memalign(alignment, size);
}

void* aligned_alloc(size_t alignment, size_t size) {
  Count();
  return __libc_memalign(alignment, size);
}

int posix_memalign(void** out, size_t alignment, size_t size) {
  Count();
  // posix_memalign's own checks: a power of two, a multiple of sizeof(void*).
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(alignment, size);
  if (p == NULL && size != 0) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(size_t size) {
  Count();
  return __libc_valloc(size);
}

void* pvalloc(size_t size) {
  Count();
  return __libc_pvalloc(size);
}

// At exit: the count, in decimal, to $ATTNSERVE_MALLOC_COUNT_FILE (nothing when it is unset).
__attribute__((destructor)) static void WriteCount(void) {
  const char* path = getenv("ATTNSERVE_MALLOC_COUNT_FILE");
  if (path == NULL || path[0] == '\0') return;
  char text[32];
  const int n = snprintf(text, sizeof(text), "%llu\n",
                         (unsigned long long)atomic_load(&allocations));
  const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  if (write(fd, text, (size_t)n) != n) {
    // Nothing to report to at exit; a short file reads as a failed measurement.
  }
  close(fd);
}
