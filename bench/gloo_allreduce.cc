// gloo_allreduce RANK SIZE STORE_DIR TRANSPORT ALGO MIN MAX STEP ITERS WARM:
// Gloo's all-reduce (float32 sum) timed from MIN to MAX bytes, times STEP,
// for bench/coll.sh. TRANSPORT is "tcp" (Gloo's TCP transport on 127.0.0.1)
// or "ibverbs" (its ibverbs transport on device srx0: softrdma's drop-in
// libibverbs.so.1 when LD_LIBRARY_PATH points at it). ALGO is "ring"
// (AllreduceRingChunked) or "hd" (AllreduceHalvingDoubling). Ranks meet
// through a FileStore in STORE_DIR.
//
// Per size, every rank fills its buffer with (i * 7 + rank * 3) % 13, runs
// one all-reduce and checks every element, then runs WARM untimed and ITERS
// timed all-reduces (in place, as Gloo's are). Rank 0 prints the columns
// of bench/mpi_allreduce.c: bytes, count, time per all-reduce (us, the
// slowest rank's), algbw, busbw (GB/s, 2(n-1)/n), wrong elements. Exits 1
// if any element was wrong.
//
// Gloo objects are never destroyed: Debian's Gloo (2022-05) asserts in
// ~Buffer that every send of a buffer has completed, which no algorithm
// waits for (see crates/softrdma-rdmacm/tests/cpp/gloo_ring.cc); the
// process ends with _Exit once its output is flushed.
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/ibverbs/device.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

std::shared_ptr<gloo::transport::Device> device(const std::string &transport) {
  if (transport == "tcp") {
    gloo::transport::tcp::attr attr("127.0.0.1");
    return gloo::transport::tcp::CreateDevice(attr);
  }
  gloo::transport::ibverbs::attr attr;
  attr.name = "srx0";
  attr.port = 1;
  attr.index = 0;
  return gloo::transport::ibverbs::CreateDevice(attr);
}

gloo::Algorithm *allreduce(const std::string &algo,
                           const std::shared_ptr<gloo::Context> &ctx,
                           float *data, int count) {
  std::vector<float *> ptrs{data};
  if (algo == "hd")
    return new gloo::AllreduceHalvingDoubling<float>(ctx, ptrs, count);
  return new gloo::AllreduceRingChunked<float>(ctx, ptrs, count);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 11) {
    std::fprintf(stderr, "usage: gloo_allreduce RANK SIZE STORE_DIR tcp|ibverbs ring|hd "
                         "MIN MAX STEP ITERS WARM\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]);
  const int size = std::atoi(argv[2]);
  const std::string transport = argv[4], algo = argv[5];
  const long minb = std::atol(argv[6]), maxb = std::atol(argv[7]);
  const long step = std::atol(argv[8]);
  const int iters = std::atoi(argv[9]), warm = std::atoi(argv[10]);
  if (size < 1 || rank < 0 || rank >= size || minb < 4 || maxb < minb || step < 2 ||
      iters < 1 || warm < 0 || (transport != "tcp" && transport != "ibverbs") ||
      (algo != "ring" && algo != "hd")) {
    std::fprintf(stderr, "gloo_allreduce: bad arguments\n");
    return 2;
  }

  gloo::rendezvous::FileStore store(argv[3]);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  auto dev = device(transport);
  ctx->connectFullMesh(store, dev);

  std::vector<float> data(size_t(maxb / 4));
  long wrong_total = 0;
  for (long bytes = minb;; bytes *= step) {
    if (bytes > maxb)
      bytes = maxb;
    const int count = int(bytes / 4);
    auto *ar = allreduce(algo, ctx, data.data(), count);
    for (int i = 0; i < count; i++)
      data[i] = float((long(i) * 7 + rank * 3) % 13);
    ar->run();
    long wrong = 0;
    for (int i = 0; i < count; i++) {
      float want = 0;
      for (int r = 0; r < size; r++)
        want += float((long(i) * 7 + r * 3) % 13);
      wrong += data[i] != want;
    }
    wrong_total += wrong;
    for (int i = 0; i < warm; i++)
      ar->run();
    (new gloo::BarrierAllToAll(ctx))->run();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++)
      ar->run();
    double t = seconds_since(t0) / iters;
    // The slowest rank's time: an all-reduce of the times with max.
    auto *slowest = new double(t);
    std::vector<double *> tp{slowest};
    (new gloo::AllreduceRingChunked<double>(ctx, tp, 1, gloo::ReductionFunction<double>::max))
        ->run();
    t = *slowest;
    if (rank == 0) {
      const double algbw = double(bytes) / t / 1e9;
      std::printf("%12ld  %12d  %10.2f  %7.2f  %7.2f  %6ld\n", bytes, count, t * 1e6, algbw,
                  algbw * 2.0 * (size - 1) / size, wrong);
      std::fflush(stdout);
    }
    if (bytes >= maxb)
      break;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(wrong_total != 0);
}
