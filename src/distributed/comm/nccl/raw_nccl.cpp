// The benchmark's baseline: ncclAllReduce called directly on a communicator of its own.
#include "distributed/comm/raw_nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_context.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace {
void nccl_ok(ncclResult_t r, const char* call) {
  TANDEM_RUNTIME_CHECK(r == ncclSuccess, call, " failed: ", ncclGetErrorString(r));
}
}  // namespace

std::vector<double> raw_nccl_allreduce_seconds(const std::vector<int64_t>& sizes, int iters, int warmup, int device) {
  DistEnv env = detect_env();
  Store& store = rendezvous_store();
  static int round = 0;
  std::string key = "raw_nccl_id/" + std::to_string(round++);
  ncclUniqueId id;
  if (env.rank == 0) {
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
  } else {
    std::string bytes = store.get(key);
    TANDEM_RUNTIME_CHECK(bytes.size() == sizeof id, "malformed NCCL id in the rendezvous store");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  cuda::set_device(device);
  ncclComm_t comm;
  nccl_ok(ncclCommInitRank(&comm, env.world_size, id, env.rank), "ncclCommInitRank");
  cudaStream_t stream;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int64_t largest = 0;
  for (int64_t s : sizes) largest = std::max(largest, s);
  void* buf = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&buf, static_cast<size_t>(largest)));
  TANDEM_CUDA_CHECK(cudaMemset(buf, 0, static_cast<size_t>(largest)));
  std::vector<double> out;
  try {
    for (int64_t bytes : sizes) {
      size_t count = static_cast<size_t>(bytes / 4);
      for (int i = 0; i < warmup; ++i)
        nccl_ok(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i)
        nccl_ok(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
    }
  } catch (...) {
    cudaFree(buf);
    ncclCommDestroy(comm);
    cudaStreamDestroy(stream);
    throw;
  }
  TANDEM_CUDA_CHECK(cudaFree(buf));
  nccl_ok(ncclCommDestroy(comm), "ncclCommDestroy");
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

}  // namespace tandem::dist
