// gloo_ring.cc RANK SIZE STORE_DIR: Gloo's ring allreduce (sum) of 1 MiB of
// float32 over its ibverbs transport on device srx0, ranks meeting through
// a FileStore in STORE_DIR. Rank k contributes (k + 1) * (i % 1000) + k to
// element i; every element is checked on every rank. Prints
// "gloo_ring: ok rank=R size=N" and exits 0 only when all are right.
#include <gloo/allreduce_ring.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/ibverbs/device.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

int main(int argc, char **argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: gloo_ring RANK SIZE STORE_DIR\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  const size_t n = 1024 * 1024 / sizeof(float);

  gloo::transport::ibverbs::attr attr;
  attr.name = "srx0";
  attr.port = 1;
  attr.index = 0;
  auto dev = gloo::transport::ibverbs::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);

  std::vector<float> data(n);
  for (size_t i = 0; i < n; i++)
    data[i] = float((rank + 1) * int(i % 1000) + rank);
  std::vector<float *> ptrs{data.data()};
  // Two barriers are made before the allreduce (buffers of their own
  // slots) and run after it, while the allreduce still lives. Debian's Gloo
  // (2022-05) asserts in ~Buffer that every send of the buffer has
  // completed, but no algorithm waits for its last send (AllreduceRing's
  // last notification WRITE): whether its completion was polled in time is
  // a race with the peer's ACK, which hardware's microseconds win and a
  // software RDMA's round trip, through threads that sleep, loses. Gloo
  // upstream turned the assertion into a warning (pytorch/gloo#437). A
  // peer sends its ACK of that WRITE before its message of the second
  // barrier (which it sends only after the first barrier's exchange), on
  // the same QP, so the WRITE's completion is in our CQ before that
  // message's, and Gloo's one device thread polls them in order: the
  // allreduce's sends are done when the second barrier returns. (One
  // barrier is not enough: an ACK held for a reply to ride with may follow
  // that barrier's message.) The barriers, whose own last sends nothing
  // waits for either, are left to the exit instead of their destructors.
  auto *first = new gloo::BarrierAllToAll(ctx);
  auto *second = new gloo::BarrierAllToAll(ctx);
  {
    gloo::AllreduceRing<float> allreduce(ctx, ptrs, int(n));
    allreduce.run();
    first->run();
    second->run();
  }

  const int a = size * (size + 1) / 2, b = size * (size - 1) / 2;
  for (size_t i = 0; i < n; i++) {
    const float want = float(a * int(i % 1000) + b);
    if (data[i] != want) {
      std::fprintf(stderr, "gloo_ring: rank %d element %zu: %g, want %g\n", rank, i,
                   double(data[i]), double(want));
      return 1;
    }
  }
  std::printf("gloo_ring: ok rank=%d size=%d\n", rank, size);
  // Before the destructors run: Gloo's ~Buffer may abort, and abort()
  // does not flush stdio.
  std::fflush(stdout);
  return 0;
}
