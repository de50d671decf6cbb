// Checkpoints: round trip of parameters, buffers and optimizer state; clear errors for bad files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstring>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tandem/autograd.h"
#include "tandem/checkpoint.h"
#include "tandem/nn/models.h"
#include "tandem/ops.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("tandem_ckpt_" + name + "_" + std::to_string(getpid()));
}

// One SGD step on a fixed batch, so that parameters and momentum hold something.
void train_step(nn::Module& m, optim::Optimizer& opt, uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::normal({4, 1, 28, 28}, 0.0, 1.0, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 3, 5, 9}, {4});
  Tensor loss = softmax_cross_entropy(m.forward(x), y);
  opt.zero_grad();
  backward(loss);
  opt.step();
}

std::vector<float> flat(const std::vector<Tensor>& ts) {
  std::vector<float> out;
  for (const Tensor& t : ts)
    for (float v : t.to_vector<float>()) out.push_back(v);
  return out;
}

}  // namespace

TEST(Checkpoint, RoundTripContinuesExactlyLikeTheOriginal) {
  nn::ModelConfig cfg;
  auto a = nn::make_model("cnn", cfg);
  optim::SGD sa(a->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  train_step(*a, sa, 1);
  fs::path p = temp_file("roundtrip");
  save_checkpoint(p.string(), *a, &sa, R"({"epoch": 3, "note": "x"})");

  cfg.seed = 99;  // different initial values
  auto b = nn::make_model("cnn", cfg);
  optim::SGD sb(b->parameters(), {.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4});
  std::string meta = load_checkpoint(p.string(), *b, &sb);
  EXPECT_NE(meta.find("\"epoch\":3"), std::string::npos) << meta;
  EXPECT_EQ(flat(a->parameters()), flat(b->parameters()));
  EXPECT_EQ(sb.steps(), sa.steps());
  // The momentum came back too: one more identical step keeps the two identical.
  train_step(*a, sa, 2);
  train_step(*b, sb, 2);
  EXPECT_EQ(flat(a->parameters()), flat(b->parameters()));
  fs::remove(p);
}

TEST(Checkpoint, BuffersAndAdamStateRoundTrip) {
  nn::ModelConfig cfg;
  cfg.height = cfg.width = 32;
  cfg.in_channels = 1;
  auto a = nn::make_model("resnet18", cfg);
  optim::Adam oa(a->parameters(), {.lr = 1e-3});
  Generator gen(5);
  Tensor x = Tensor::normal({2, 1, 32, 32}, 0.0, 1.0, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{1, 2}, {2});
  backward(softmax_cross_entropy(a->forward(x), y));
  oa.step();
  fs::path p = temp_file("adam");
  save_checkpoint(p.string(), *a, &oa);
  cfg.seed = 7;
  auto b = nn::make_model("resnet18", cfg);
  optim::Adam ob(b->parameters(), {.lr = 1e-3});
  load_checkpoint(p.string(), *b, &ob);
  std::vector<Tensor> ba, bb;
  for (auto& [n, t] : a->named_buffers()) ba.push_back(t);
  for (auto& [n, t] : b->named_buffers()) bb.push_back(t);
  EXPECT_EQ(flat(ba), flat(bb));
  EXPECT_EQ(*ob.step_counts(), *oa.step_counts());
  fs::remove(p);
}

TEST(Checkpoint, AnotherModelIsRefusedAndLeftUntouched) {
  auto a = nn::make_model("cnn", {});
  fs::path p = temp_file("other");
  save_checkpoint(p.string(), *a, nullptr);
  nn::ModelConfig c;
  c.hidden = {16};
  auto m = nn::make_model("mlp", c);
  std::vector<float> before = flat(m->parameters());
  try {
    load_checkpoint(p.string(), *m, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(flat(m->parameters()), before);
  fs::remove(p);
}

TEST(Checkpoint, DamagedAndForeignFilesAreNamed) {
  auto a = nn::make_model("cnn", {});
  fs::path p = temp_file("damaged");
  save_checkpoint(p.string(), *a, nullptr);
  fs::resize_file(p, fs::file_size(p) / 2);
  auto b = nn::make_model("cnn", {});
  EXPECT_THROW(load_checkpoint(p.string(), *b, nullptr), Error);
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << "definitely not a checkpoint";
  }
  try {
    load_checkpoint(p.string(), *b, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a tandem checkpoint"), std::string::npos) << e.what();
  }
  fs::remove(p);
  EXPECT_THROW(load_checkpoint(p.string(), *b, nullptr), Error);
}

namespace {

// The parts of a version 2 file, to damage them on purpose.
struct RawCheckpoint {
  std::string prefix;  // magic, version, header length
  nlohmann::json header;
  std::string data;

  static RawCheckpoint read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    uint64_t len = 0;
    std::memcpy(&len, all.data() + 12, 8);
    RawCheckpoint r;
    r.prefix = all.substr(0, 20);
    r.header = nlohmann::json::parse(all.substr(24, len));
    r.data = all.substr(24 + len);
    return r;
  }
  // Writes the file back; with fix_crc the header's checksum matches the edited header.
  void write(const fs::path& p, bool fix_crc = true, uint32_t version = 2) const {
    std::string head = header.dump();
    uint64_t len = head.size();
    uint32_t crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(head.data()), len));
    if (!fix_crc) crc ^= 1;
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(prefix.data(), 8);
    f.write(reinterpret_cast<const char*>(&version), 4);
    f.write(reinterpret_cast<const char*>(&len), 8);
    if (version >= 2) f.write(reinterpret_cast<const char*>(&crc), 4);
    f << head << data;
  }
  nlohmann::json& entry(const std::string& name) {
    for (auto& e : header["tensors"])
      if (e["name"] == name) return e;
    throw std::runtime_error("no entry " + name);
  }
};

nn::ModulePtr small_mlp() {
  nn::ModelConfig c;
  c.hidden = {8, 8};
  return nn::make_model("mlp", c);
}

// Loads p into a fresh mlp, expecting an input error that contains every fragment, with the model untouched.
void expect_refused(const fs::path& p, const std::vector<std::string>& fragments) {
  auto m = small_mlp();
  std::vector<float> before = flat(m->parameters());
  try {
    load_checkpoint(p.string(), *m, nullptr);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input) << e.what();
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
  EXPECT_EQ(flat(m->parameters()), before);
}

std::string first_bias(const nlohmann::json& header, const std::string& skip = "") {
  for (auto& e : header["tensors"]) {
    std::string n = e["name"];
    if (n.find("bias") != std::string::npos && n != skip && e["bytes"] == 32) return n;
  }
  return "";
}

}  // namespace

TEST(Checkpoint, FlippedTensorByteIsRefusedNamingTheTensor) {
  auto a = small_mlp();
  fs::path p = temp_file("flip");
  save_checkpoint(p.string(), *a, nullptr);
  RawCheckpoint r = RawCheckpoint::read(p);
  const nlohmann::json& last = r.header["tensors"].back();
  r.data[r.data.size() - 1] ^= 0x10;
  r.write(p);
  expect_refused(p, {p.string(), "damaged", last["name"].get<std::string>(), "checksum"});
  fs::remove(p);
}

TEST(Checkpoint, SwappedOffsetsAreRefused) {
  auto a = small_mlp();
  optim::SGD sgd(a->parameters(), {.lr = 0.1});
  train_step(*a, sgd, 3);  // the biases start at zero: a step makes them differ
  fs::path p = temp_file("swap");
  save_checkpoint(p.string(), *a, nullptr);
  RawCheckpoint r = RawCheckpoint::read(p);
  std::string b1 = first_bias(r.header), b2 = first_bias(r.header, b1);
  ASSERT_FALSE(b1.empty() || b2.empty());
  std::swap(r.entry(b1)["offset"], r.entry(b2)["offset"]);
  r.write(p, /*fix_crc=*/false);  // the header's own checksum catches the edit
  expect_refused(p, {"damaged", "header does not match its checksum"});
  r.write(p, /*fix_crc=*/true);   // a consistent header: the tensors' checksums catch it
  expect_refused(p, {"damaged", "checksum"});
  fs::remove(p);
}

TEST(Checkpoint, WrongJsonTypesGiveAClearError) {
  auto a = small_mlp();
  fs::path p = temp_file("types");
  save_checkpoint(p.string(), *a, nullptr);
  const RawCheckpoint orig = RawCheckpoint::read(p);
  const std::string name = orig.header["tensors"][0]["name"];
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* says;
  };
  for (const Case& c : {Case{"shape", "8x784", "\"shape\" is not a list"},
                        Case{"shape", nlohmann::json::array({-8, 784}), "non-negative integers"},
                        Case{"shape", nlohmann::json::array({0, 1ll << 40, 1ll << 40}), "impossibly large"},
                        Case{"offset", "0", "\"offset\" and \"bytes\""},
                        Case{"dtype", 7, "\"dtype\" is not a string"},
                        Case{"bytes", 3, "need"},
                        Case{"crc32", nullptr, "crc32"}}) {
    RawCheckpoint r = orig;
    r.entry(name)[c.field] = c.value;
    r.write(p);
    expect_refused(p, {p.string(), "damaged", c.says});
  }
  RawCheckpoint r = orig;
  r.header["tensors"] = "none";
  r.write(p);
  expect_refused(p, {"damaged", "\"tensors\""});
  r = orig;
  r.header["meta"] = 5;
  r.write(p);
  EXPECT_THROW(checkpoint_meta(p.string()), Error);
  fs::remove(p);
}

TEST(Checkpoint, TrailingBytesAreRefused) {
  auto a = small_mlp();
  fs::path p = temp_file("trailing");
  save_checkpoint(p.string(), *a, nullptr);
  std::ofstream(p, std::ios::binary | std::ios::app) << "xyz";
  expect_refused(p, {"3 unexpected bytes"});
  fs::remove(p);
}

TEST(Checkpoint, VersionOneFilesStillLoad) {
  auto a = small_mlp();
  fs::path p = temp_file("v1");
  save_checkpoint(p.string(), *a, nullptr);
  RawCheckpoint r = RawCheckpoint::read(p);
  for (auto& e : r.header["tensors"]) e.erase("crc32");
  r.write(p, true, /*version=*/1);
  nn::ModelConfig c;
  c.hidden = {8, 8};
  c.seed = 5;
  auto b = nn::make_model("mlp", c);
  load_checkpoint(p.string(), *b, nullptr);
  EXPECT_EQ(flat(a->parameters()), flat(b->parameters()));
  fs::remove(p);
}

TEST(Checkpoint, AFailedSaveLeavesNoPartialFile) {
  // The final rename cannot replace a non-empty directory: the save fails after writing everything.
  fs::path parent = temp_file("dir_in_the_way");
  fs::remove_all(parent);
  fs::create_directories(parent / "ck" / "x");
  auto a = small_mlp();
  EXPECT_THROW(save_checkpoint((parent / "ck").string(), *a, nullptr), Error);
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(parent)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"ck"});  // nothing written beside it stays behind
  fs::remove_all(parent);
}

TEST(Checkpoint, PathIsCheckedBeforeTraining) {
  fs::path dir = temp_file("checkdir");
  try {
    check_checkpoint_path((dir / "ck.bin").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), Error::Kind::Input);
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  fs::create_directories(dir);
  EXPECT_THROW(check_checkpoint_path(dir.string()), Error);  // a directory, not a file
  EXPECT_NO_THROW(check_checkpoint_path((dir / "ck.bin").string()));
  EXPECT_TRUE(fs::is_empty(dir));  // the probe left nothing behind
  fs::remove_all(dir);
}

TEST(Checkpoint, FifoIsRefusedWithoutBlocking) {
  fs::path p = temp_file("fifo");
  ASSERT_EQ(mkfifo(p.c_str(), 0600), 0);
  expect_refused(p, {"not a regular file"});
  fs::remove(p);
}

TEST(Checkpoint, TensorsReadBackByName) {
  auto a = small_mlp();
  fs::path p = temp_file("tensors");
  save_checkpoint(p.string(), *a, nullptr);
  auto tensors = read_checkpoint_tensors(p.string());
  auto params = a->named_parameters();
  ASSERT_EQ(tensors.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(tensors[i].first, "param/" + params[i].first);
    EXPECT_EQ(tensors[i].second.to_vector<float>(), params[i].second.to_vector<float>());
  }
  fs::remove(p);
}

namespace {

std::string contents(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// A directory holding a file a save must never touch and a link to it at `link_name`.
fs::path dir_with_planted_link(const std::string& name, const std::string& link_name) {
  fs::path dir = temp_file(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "victim") << "not yours";
  fs::create_symlink(dir / "victim", dir / link_name);
  return dir;
}

}  // namespace

TEST(Checkpoint, ALinkPlantedAtThePartialNameIsNotWrittenThrough) {
  fs::path dir = dir_with_planted_link("planted_partial", "ck.partial");
  auto a = small_mlp();
  save_checkpoint((dir / "ck").string(), *a, nullptr, R"({"epoch": 1})");
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "ck")));
  EXPECT_EQ(read_checkpoint_tensors((dir / "ck").string()).size(), a->named_parameters().size());
  EXPECT_NE(checkpoint_meta((dir / "ck").string()).find("\"epoch\":1"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, ALinkAtTheCheckpointItselfIsReplacedNotFollowed) {
  fs::path dir = dir_with_planted_link("planted_target", "ck");
  auto a = small_mlp();
  save_checkpoint((dir / "ck").string(), *a, nullptr);
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir / "ck")));
  EXPECT_EQ(read_checkpoint_tensors((dir / "ck").string()).size(), a->named_parameters().size());
  fs::remove_all(dir);
}

TEST(Checkpoint, PathCheckDoesNotWriteThroughAPlantedLink) {
  fs::path dir = dir_with_planted_link("planted_probe", "ck.partial");
  EXPECT_NO_THROW(check_checkpoint_path((dir / "ck").string()));
  EXPECT_EQ(contents(dir / "victim"), "not yours");
  EXPECT_TRUE(fs::is_symlink(dir / "ck.partial"));  // someone else's link is theirs to remove
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);  // the probe left nothing
  fs::remove_all(dir);
}
