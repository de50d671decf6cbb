// Writes a small valid input of each kind into DIR/<harness>/, the fuzzers' starting corpus.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "distributed/rendezvous/store_protocol.h"
#include "fuzz_model.h"
#include "tandem/checkpoint.h"
#include "tandem/optim/optimizer.h"

namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

std::string gzip(const std::string& s) {
  uLongf cap = compressBound(static_cast<uLong>(s.size())) + 64;
  std::string out(cap, '\0');
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  zs.avail_in = static_cast<uInt>(s.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string idx(const std::vector<uint32_t>& dims) {
  std::string s = {0, 0, 8, static_cast<char>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    tandem::dist::proto::put_u32(s, d);
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i * 7));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  fs::path dir = argv[1];
  write(dir / "idx/labels", idx({5}));
  write(dir / "idx/images", idx({2, 3, 3}));
  write(dir / "idx/images.gz", gzip(idx({2, 3, 3})));
  std::string cifar;
  for (int r = 0; r < 2; ++r) {
    cifar.push_back(static_cast<char>(r + 3));
    cifar += std::string(3072, static_cast<char>(r));
  }
  write(dir / "cifar/batch", cifar);
  write(dir / "cifar/batch.gz", gzip(cifar));
  auto model = tandem::fuzz::small_model();
  tandem::optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  fs::create_directories(dir / "checkpoint");
  tandem::save_checkpoint((dir / "checkpoint/plain").string(), *model, nullptr, R"({"epoch": 1})");
  tandem::save_checkpoint((dir / "checkpoint/with_optimizer").string(), *model, &sgd, "{}");
  namespace proto = tandem::dist::proto;
  auto body = [](const std::string& frame) { return frame.substr(4); };
  write(dir / "store/set", body(proto::encode(proto::kSet, {"key", "value"})));
  write(dir / "store/get", body(proto::encode(proto::kGet, {"key"})));
  write(dir / "store/add", body(proto::encode(proto::kAdd, {"counter", "1"})));
  write(dir / "store/empty", body(proto::encode(proto::kCheck, {})));
  return 0;
}
