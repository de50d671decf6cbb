#include "dist/sync_check.h"

#include <cstring>

namespace tandem::dist {

namespace {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t describe_hash(const std::string& name, const Tensor& t, uint64_t h) {
  h = fnv1a(name.data(), name.size(), h);
  for (int64_t d : t.shape()) h = fnv1a(&d, sizeof d, h);
  auto dt = static_cast<uint8_t>(t.dtype());
  return fnv1a(&dt, 1, h);
}

// Every rank's copy of `mine`, flattened rank by rank.
std::vector<int64_t> gather(Communicator& comm, const std::vector<int64_t>& mine) {
  Tensor in = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}).to(comm.device());
  Tensor out = Tensor::empty({static_cast<int64_t>(mine.size()) * comm.size()}, DType::i64, comm.device());
  comm.all_gather(in, out)->wait();
  return out.to_vector<int64_t>();
}

}  // namespace

void check_same_model(Communicator& comm, const std::vector<std::string>& names, const std::vector<Tensor>& params,
                      const nn::NamedTensors& buffers) {
  int64_t total = 0, buf_total = 0;
  uint64_t h = 1469598103934665603ull, hb = h;
  for (size_t i = 0; i < params.size(); ++i) {
    total += params[i].numel();
    h = describe_hash(names[i], params[i], h);
  }
  for (auto& [name, t] : buffers) {
    buf_total += t.numel();
    hb = describe_hash(name, t, hb);
  }
  enum { kWorld, kCount, kTotal, kHash, kBufCount, kBufTotal, kBufHash, kFields };
  std::vector<int64_t> sig = {comm.size(), static_cast<int64_t>(params.size()), total, static_cast<int64_t>(h),
                              static_cast<int64_t>(buffers.size()), buf_total, static_cast<int64_t>(hb)};
  std::vector<int64_t> all = gather(comm, sig);
  const int me = comm.rank();
  bool same_count = true;
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* s = &all[static_cast<size_t>(r) * kFields];
    same_count = same_count && s[kCount] == sig[kCount];
    TANDEM_CHECK(s[kWorld] == sig[kWorld], "ranks disagree on the world size: rank ", r, " says ", s[kWorld],
                 ", rank ", me, " says ", sig[kWorld]);
  }
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* s = &all[static_cast<size_t>(r) * kFields];
    TANDEM_CHECK(s[kCount] == sig[kCount] && s[kTotal] == sig[kTotal], "ranks built different models: rank ", r,
                 " has ", s[kCount], " parameter tensors with ", s[kTotal], " values, rank ", me, " has ",
                 sig[kCount], " with ", sig[kTotal], " (same --model, --hidden and data set on every rank?)");
    TANDEM_CHECK(s[kBufCount] == sig[kBufCount] && s[kBufTotal] == sig[kBufTotal] && s[kBufHash] == sig[kBufHash],
                 "ranks built different models: rank ", r, " has ", s[kBufCount], " buffers with ", s[kBufTotal],
                 " values, rank ", me, " has ", sig[kBufCount], " with ", sig[kBufTotal]);
  }
  if (!same_count) return;  // unreachable: the count check above threw on every rank
  // Same number of tensors everywhere: find the first one whose name, shape or dtype differs.
  std::vector<int64_t> per;
  for (size_t i = 0; i < params.size(); ++i)
    per.push_back(static_cast<int64_t>(describe_hash(names[i], params[i], 1469598103934665603ull)));
  std::vector<int64_t> every = gather(comm, per);
  for (int r = 0; r < comm.size(); ++r)
    for (size_t i = 0; i < params.size(); ++i)
      TANDEM_CHECK(every[static_cast<size_t>(r) * params.size() + i] == per[i], "ranks built different models: ",
                   "parameter ", i, " (", names[i], ", ", params[i].str(), " on rank ", me,
                   ") has another name, shape or dtype on rank ", r);
}

void check_identical_values(Communicator& comm, const std::vector<Tensor>& tensors,
                            const std::vector<std::string>& names) {
  std::vector<int64_t> mine;
  for (const Tensor& t : tensors) {
    Tensor host = t.detach().contiguous().to(Device::cpu());
    mine.push_back(static_cast<int64_t>(fnv1a(host.data_ptr(), host.nbytes())));
  }
  std::vector<int64_t> all = gather(comm, mine);
  const size_t n = tensors.size();
  for (size_t i = 0; i < n; ++i)
    for (int r = 1; r < comm.size(); ++r)
      TANDEM_CHECK(all[static_cast<size_t>(r) * n + i] == all[i], "ranks hold different values in ", names[i],
                   " (", tensors[i].str(), "): rank ", r, " differs from rank 0",
                   "; the replicas have diverged");
}

}  // namespace tandem::dist
