/* examples/embed/embed.c — a C program embedding zinf through its installed package: file I/O
 * like DeepSpeed's aio_handle (O_DIRECT, pinned buffers), the CPU Adam step, and the engine
 * paging registered tensors through a device budget smaller than them, every status checked. Usage: embed DIR (a directory for its scratch file). Prints "embed: ok" and exits 0
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

  /* The engine: eight 1 MiB tensors homed on NVMe (DIR) through a 2 MiB device budget, each
     leased on the device, incremented and released modified, twice over (the second pass
     prefetched along the first's trace); then read back. */
  char config[4352];
  snprintf(config, sizeof config,
           "{\"zinf\": {\"swap_dir\": \"%s\", \"budgets\": {\"device_bytes\": \"2M\", "
           "\"pinned_bytes\": \"8M\"}}}",
           argv[1]);
  zinf_engine_params ep = ZINF_ENGINE_PARAMS_INIT;
  ep.config_json = config;
  ep.device = "host";
  ep.device_leases[ZINF_ROLE_PARAM] = 1;
  zinf_engine* engine = NULL;
  CHECK(zinf_engine_open(&ep, &engine));
  enum { T = 8, WORDS = 1 << 18 };
  uint64_t ids[T];
  static uint32_t words[WORDS];
  for (int t = 0; t < T; ++t) {
    zinf_tensor_spec spec = ZINF_TENSOR_SPEC_INIT;
    spec.bytes = sizeof words;
    spec.unit = (uint32_t)t;
    CHECK(zinf_tensor_register(engine, &spec, &ids[t]));
  }
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < WORDS; ++i) words[i] = (uint32_t)(t * 1000 + i);
    CHECK(zinf_tensor_write(engine, ids[t], words));
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (int t = 0; t < T; ++t) {
      uint64_t lease = 0;
      uint32_t* w = NULL;
      CHECK(zinf_acquire(engine, ids[t], ZINF_TIER_DEVICE, ZINF_ACQUIRE_READ, &lease));
      CHECK(zinf_lease_wait(engine, lease, (void**)&w));
      for (int i = 0; i < WORDS; ++i) w[i] += 1;
      CHECK(zinf_release(engine, lease, 1));
    }
    CHECK(zinf_engine_end_step(engine));
  }
  for (int t = 0; t < T; ++t) {
    CHECK(zinf_tensor_read(engine, ids[t], words));
    if (words[7] != (uint32_t)(t * 1000 + 7 + 2)) {
      fprintf(stderr, "embed: tensor %d holds %u, expected %u\n", t, words[7], t * 1000 + 9);
      return 1;
    }
  }
  const char* stats = NULL;
  CHECK(zinf_engine_stats(engine, &stats));
  if (strstr(stats, "\"nvme_read\"") == NULL) {
    fprintf(stderr, "embed: statistics without nvme_read: %s\n", stats);
    return 1;
  }
  /* A lease released twice is a status, not a crash. */
  uint64_t lease = 0;
  CHECK(zinf_acquire(engine, ids[0], ZINF_TIER_HOST, ZINF_ACQUIRE_READ, &lease));
  CHECK(zinf_release(engine, lease, 0));
  if (zinf_release(engine, lease, 0) != ZINF_E_NOT_FOUND) {
    fprintf(stderr, "embed: a second release was not refused\n");
    return 1;
  }
  CHECK(zinf_engine_close(engine));
  printf("embed: ok (zinf %s; file I/O, Adam, and %d tensors paged through the engine)\n",
         zinf_version(), T);
  return 0;
}
