// `tandem train --model gpt --init DIR` from a Hugging Face GPT-2 whose vocabulary is not a multiple of 64
// (tests/fixtures/hf/gpt2_tiny: 97 tokens): the model trains a table of 128 rows whose padding stays zero under
// AdamW with weight decay, its checkpoint records the 97 tokens, a run stopped and resumed (--init DIR
// --resume) ends in the bits of the uninterrupted run, and `tandem export --format hf` writes the 97 tokens'
// table, which reads back as the checkpoint's model.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"
#include "tandem/checkpoint.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/pretrained.h"
#include "tandem/safetensors.h"

namespace fs = std::filesystem;
using tandem::Tensor;
using tandem::test::run_tandem;
using tandem::test::step_losses;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_gpt2_init_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

bool all_zero(const Tensor& t) {
  for (float v : t.contiguous().to(tandem::DType::f32).to_vector<float>())
    if (v != 0.0f) return false;
  return true;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

}  // namespace

TEST(Gpt2InitCli, APaddedTableTrainsResumesAndExportsItsVocabulary) {
  const fs::path dir = temp_dir("run");
  const fs::path init = fs::path(TANDEM_SOURCE_DIR) / "tests" / "fixtures" / "hf" / "gpt2_tiny";
  // Capitals, spaces, full stops and newlines: bytes below 97.
  std::ofstream(dir / "a.txt") << tandem::test::upper_case(tandem::test::corpus_text(1, 20000));
  std::ofstream(dir / "b.txt") << tandem::test::upper_case(tandem::test::corpus_text(2, 5000));
  const fs::path corpus = dir / "corpus";
  auto d = run_tandem("data text " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() + " -o " +
                      corpus.string() + " --val 0.2");
  ASSERT_EQ(d.status, 0) << d.output;
  const std::string run = "train --model gpt --init " + init.string() + " --data " + corpus.string() +
                          " --steps 4 --batch-size 2 --context 16 --lr 1e-2 --warmup 0 --weight-decay 0.1 "
                          "--eval-every 0 --eval-steps 1 --threads 1 --seed 3 --checkpoint ";
  const std::string whole = (dir / "whole.ck").string(), parted = (dir / "parted.ck").string();
  auto a = run_tandem(run + whole);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("vocabulary 97"), std::string::npos) << a.output;
  EXPECT_EQ(step_losses(a.output).size(), 4u) << a.output;
  auto s = run_tandem(run + parted + " --stop-at 2");
  ASSERT_EQ(s.status, 0) << s.output;
  // --init DIR with --resume: the directory gives the shape (no shape flag builds the padded table), the
  // checkpoint the state; steps 3 and 4 are trained, with the uninterrupted run's losses.
  auto r = run_tandem(run + parted + " --resume");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto la = step_losses(a.output), lr = step_losses(r.output);
  ASSERT_EQ(lr.size(), 2u) << r.output;
  EXPECT_EQ(lr.begin()->first, 3) << r.output;
  EXPECT_EQ(lr.at(3), la.at(3));
  EXPECT_EQ(lr.at(4), la.at(4));
  tandem::test::expect_same_tensors(parted, whole, "the resumed run");

  // The checkpoint: a table of 128 rows, trained, its padding zero; the vocabulary recorded is 97.
  const auto meta = nlohmann::json::parse(tandem::checkpoint_meta(whole));
  EXPECT_EQ(meta["vocab"], 97);
  EXPECT_EQ(meta["gpt"]["vocab"], 128);
  EXPECT_EQ(meta["gpt"]["logical_vocab"], 97);
  auto tensors = tandem::test::tensors_of(whole);
  ASSERT_TRUE(tensors.count("param/wte.weight"));
  const Tensor wte = tensors.at("param/wte.weight");
  ASSERT_EQ(wte.shape(), (tandem::Shape{128, 32}));
  EXPECT_TRUE(all_zero(wte.narrow(0, 97, 31))) << "the padding rows after 4 AdamW steps with weight decay";
  tandem::SafetensorsFile original((init / "model.safetensors").string());
  EXPECT_FALSE(same_bits(wte.narrow(0, 0, 97), original.tensor(*original.find("transformer.wte.weight"),
                                                                 tandem::DType::f32)))
      << "the table did not train";

  // Exported: the file's 97 rows, the checkpoint's values; read back, the checkpoint's model.
  const fs::path hf = dir / "hf";
  auto e = run_tandem("export --checkpoint " + whole + " --format hf -o " + hf.string());
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(hf / "config.json"))["vocab_size"], 97);
  tandem::SafetensorsFile exported((hf / "model.safetensors").string());
  const tandem::SafetensorsEntry* table = exported.find("transformer.wte.weight");
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->shape, (tandem::Shape{97, 32}));
  EXPECT_TRUE(same_bits(exported.tensor(*table, tandem::DType::f32), wte.narrow(0, 0, 97)));
  tandem::nn::Pretrained back = tandem::nn::from_pretrained(hf.string());
  for (auto& [name, t] : back.model->named_parameters())
    EXPECT_TRUE(same_bits(t.detach(), tensors.at("param/" + name))) << name;
  fs::remove_all(dir);
}
