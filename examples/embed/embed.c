/* examples/embed/embed.c — a C program embedding zinf through its installed package: file I/O
 * like DeepSpeed's aio_handle (O_DIRECT, pinned buffers) and the CPU Adam step, every status
 * checked. Usage: embed DIR (a directory for its scratch file). Prints "embed: ok" and exits 0
 * when every check holds; otherwise names the failed call and zinf's message, exits 1.
 * Built by tests/capi/install_test.sh with find_package(zinf) and with pkg-config. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zinf/zinf.h>

#define CHECK(call)                                                                     \
  do {                                                                                  \
    int rc_ = (call);                                                                   \
    if (rc_ != ZINF_OK) {                                                               \
      fprintf(stderr, "embed: %s: %s: %s\n", #call, zinf_strerror(rc_), zinf_last_error()); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: embed DIR\n");
    return 2;
  }
  if (zinf_version_number() != ZINF_VERSION_NUMBER) {
    fprintf(stderr, "embed: header %d, library %d\n", ZINF_VERSION_NUMBER, zinf_version_number());
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/embed.bin", argv[1]);

  /* Write 4 MiB from a pinned buffer, read it back into another, compare. */
  const uint64_t bytes = 4u << 20;
  unsigned char *out = NULL, *in = NULL;
  CHECK(zinf_pinned_alloc(bytes, (void**)&out));
  CHECK(zinf_pinned_alloc(bytes, (void**)&in));
  for (uint64_t i = 0; i < bytes; ++i) out[i] = (unsigned char)(i * 131 + 7);
  zinf_io_params params = ZINF_IO_PARAMS_INIT;
  params.queue_depth = 8;
  zinf_io* io = NULL;
  CHECK(zinf_io_open(&params, &io));
  /* Two halves queued, one wait. */
  CHECK(zinf_io_pwrite(io, out, bytes / 2, path, 0));
  CHECK(zinf_io_pwrite(io, out + bytes / 2, bytes / 2, path, bytes / 2));
  uint64_t done = 0;
  CHECK(zinf_io_wait(io, &done));
  if (done != 2) {
    fprintf(stderr, "embed: zinf_io_wait completed %llu transfers, expected 2\n",
            (unsigned long long)done);
    return 1;
  }
  CHECK(zinf_io_sync_pread(io, in, bytes, path, 0));
  if (memcmp(in, out, bytes) != 0) {
    fprintf(stderr, "embed: the bytes read back differ from those written\n");
    return 1;
  }
  /* A read past the end is an error, not a short count. */
  int rc = zinf_io_sync_pread(io, in, 4096, path, bytes);
  if (rc != ZINF_E_OUT_OF_RANGE) {
    fprintf(stderr, "embed: a read past the end returned %d (%s), expected out of range\n", rc,
            zinf_strerror(rc));
    return 1;
  }
  CHECK(zinf_io_close(io));
  CHECK(zinf_pinned_free(out));
  CHECK(zinf_pinned_free(in));

  /* One AdamW step against its formula. */
  enum { N = 1000 };
  static float p[N], g[N], m[N], v[N];
  static uint16_t p16[N];
  for (int i = 0; i < N; ++i) {
    p[i] = 0.01f * (float)(i % 17);
    g[i] = 0.001f * (float)((i % 13) - 6);
  }
  zinf_adam_params ap = ZINF_ADAM_PARAMS_INIT;
  ap.lr = 0.01f;
  ap.weight_decay = 0.1f;
  zinf_adam* adam = NULL;
  CHECK(zinf_adam_create(&ap, &adam));
  CHECK(zinf_adam_step(adam, 1, -1.0f, p, g, ZINF_DTYPE_F32, m, v, N, p16, ZINF_DTYPE_BF16));
  for (int i = 0; i < N; ++i) {
    /* Step 1 with bias correction: m_hat = g, v_hat = g^2, so the update is g / (|g| + eps). */
    const double p0 = 0.01 * (i % 17), g0 = 0.001 * ((i % 13) - 6);
    const double want = p0 * (1 - 0.01 * 0.1) - 0.01 * g0 / (fabs(g0) + 1e-8);
    if (fabs(p[i] - want) > 1e-6) {
      fprintf(stderr, "embed: adam element %d is %.9g, expected %.9g\n", i, p[i], want);
      return 1;
    }
  }
  CHECK(zinf_adam_destroy(adam));
  printf("embed: ok (zinf %s, engine checks passed)\n", zinf_version());
  return 0;
}
