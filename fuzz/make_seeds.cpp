// Writes a small valid input of each kind into DIR/<harness>/, the fuzzers' starting corpus.
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "distributed/rendezvous/store_protocol.h"
#include "fuzz_model.h"
#include "tandem/checkpoint.h"
#include "tandem/nn/gpt.h"
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
  // Token shards: llm.c's 256 x int32 header (magic, version, count) then uint16 tokens, and bare tokens.
  std::string tokens;
  for (int i = 0; i < 40; ++i) {
    tokens.push_back(static_cast<char>((i * 37) % 251));
    tokens.push_back(0);
  }
  std::string header(1024, '\0');
  for (auto [k, v] : {std::pair<int, uint32_t>{0, 20240520u}, {1, 1u}, {2, 40u}})
    for (int b = 0; b < 4; ++b) header[4 * k + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  write(dir / "tokens/llmc", header + tokens);
  write(dir / "tokens/bare", tokens);
  tandem::nn::GptConfig gpt;
  gpt.layers = 2, gpt.heads = 2, gpt.width = 16, gpt.context = 8, gpt.vocab = 256;
  write(dir / "gpt_text/config", tandem::nn::gpt_config_to_json(gpt));
  write(dir / "gpt_text/meta", tandem::nn::gpt_checkpoint_meta(gpt));
  write(dir / "gpt_text/gutenberg",
        "The Project Gutenberg eBook of Hamlet\n*** START OF THE PROJECT GUTENBERG EBOOK HAMLET ***\n"
        "HAMLET. To be, or not to be.\n*** END OF THE PROJECT GUTENBERG EBOOK HAMLET ***\nLicence.\n");
  return 0;
}
