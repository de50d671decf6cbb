#include "distributed/engine/sync_check.h"

#include <algorithm>
#include <cstring>

namespace tandem::dist {

namespace {

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Every rank's copy of `mine`, flattened rank by rank.
std::vector<int64_t> gather(Communicator& comm, const std::vector<int64_t>& mine) {
  Tensor in = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}).to(comm.device());
  Tensor out = Tensor::empty({static_cast<int64_t>(mine.size()) * comm.size()}, DType::i64, comm.device());
  comm.all_gather(in, out)->wait();
  return out.to_vector<int64_t>();
}

// One tensor's description for cross-rank comparison: name hash, dtype, rank, then up to kMaxDims
// extents (further extents are folded into the last slot).
constexpr size_t kMaxDims = 8;
constexpr size_t kRecord = 3 + kMaxDims;

void append_record(std::vector<int64_t>& out, const std::string& name, const Tensor& t) {
  out.push_back(static_cast<int64_t>(fnv1a(name.data(), name.size())));
  out.push_back(static_cast<int64_t>(t.dtype()));
  out.push_back(t.dim());
  int64_t dims[kMaxDims] = {};
  for (int64_t d = 0; d < t.dim(); ++d) {
    int64_t e = t.size(d);
    if (d < static_cast<int64_t>(kMaxDims))
      dims[d] = e;
    else
      dims[kMaxDims - 1] = static_cast<int64_t>(fnv1a(&e, sizeof e, static_cast<uint64_t>(dims[kMaxDims - 1])));
  }
  out.insert(out.end(), dims, dims + kMaxDims);
}

// "f32[3, 5]" from a record.
std::string describe_record(const int64_t* rec) {
  std::string s = dtype_name(static_cast<DType>(rec[1]));
  Shape shape;
  for (int64_t d = 0; d < std::min<int64_t>(rec[2], kMaxDims); ++d) shape.push_back(rec[3 + d]);
  s += shape_str(shape);
  if (rec[2] > static_cast<int64_t>(kMaxDims)) s += " (" + std::to_string(rec[2]) + " dimensions)";
  return s;
}

}  // namespace

void check_same_model(Communicator& comm, const std::vector<std::string>& names, const std::vector<Tensor>& params,
                      const nn::NamedTensors& frozen, const nn::NamedTensors& buffers) {
  // Every verdict compares each rank with rank 0, from data all ranks gathered alike: all ranks
  // reach the same verdict and throw together.
  const int world = comm.size();
  std::vector<int64_t> counts = {world, static_cast<int64_t>(params.size()), static_cast<int64_t>(frozen.size()),
                                 static_cast<int64_t>(buffers.size())};
  std::vector<int64_t> all = gather(comm, counts);
  for (int r = 1; r < world; ++r) {
    const int64_t* c = &all[static_cast<size_t>(r) * 4];
    TANDEM_CHECK(c[0] == all[0], "ranks disagree on the world size: rank 0 says ", all[0], ", rank ", r, " says ",
                 c[0]);
    TANDEM_CHECK(c[1] + c[2] == all[1] + all[2] && c[3] == all[3], "ranks built different models: rank 0 has ",
                 all[1] + all[2], " parameter tensors and ", all[3], " buffers, but rank ", r, " has ", c[1] + c[2],
                 " and ", c[3], " (same --model, --hidden and data set on every rank?)");
    TANDEM_CHECK(c[1] == all[1], "ranks freeze different parameters: rank 0 trains ", all[1], " parameter tensors and "
                 "keeps ", all[2], " frozen, but rank ", r, " trains ", c[1], " and keeps ", c[2], " frozen (set "
                 "requires_grad alike on every rank)");
  }
  // Same numbers of tensors everywhere: compare each one's name, dtype and shape.
  std::vector<int64_t> mine;
  std::vector<std::string> what, local_name;  // "parameter 4", "2.weight"
  for (size_t i = 0; i < params.size(); ++i) {
    append_record(mine, names[i], params[i]);
    what.push_back("parameter " + std::to_string(i));
    local_name.push_back(names[i]);
  }
  for (size_t i = 0; i < frozen.size(); ++i) {
    append_record(mine, frozen[i].first, frozen[i].second);
    what.push_back("frozen parameter " + std::to_string(i));
    local_name.push_back(frozen[i].first);
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    append_record(mine, buffers[i].first, buffers[i].second);
    what.push_back("buffer " + std::to_string(i));
    local_name.push_back(buffers[i].first);
  }
  if (mine.empty()) return;
  std::vector<int64_t> every = gather(comm, mine);
  const size_t n = what.size();
  const int me = comm.rank();
  for (size_t i = 0; i < n; ++i) {
    const int64_t* ref = &every[i * kRecord];
    for (int r = 1; r < world; ++r) {
      const int64_t* rec = &every[(static_cast<size_t>(r) * n + i) * kRecord];
      if (std::equal(rec, rec + kRecord, ref)) continue;
      TANDEM_CHECK(rec[0] == ref[0], "ranks built different models: ", what[i], " has one name on rank 0 and another ",
                   "on rank ", r, " (on rank ", me, " it is ", local_name[i], ")");
      TANDEM_CHECK(false, "ranks built different models: ", what[i], " (", local_name[i], ") is ", describe_record(ref),
                   " on rank 0 but ", describe_record(rec), " on rank ", r);
    }
  }
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
