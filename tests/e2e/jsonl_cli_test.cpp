// `tandem data jsonl` and `tandem train` on what it writes, from the command line: the help, errors that
// name the file and line (or the template), a tiny Llama trained on the masked windows (its step lines,
// the loss mask line, the validation loss), a --context other than the data's refused, and a run stopped
// and resumed giving the uninterrupted run's checkpoint.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "e2e/checkpoint_files.h"
#include "e2e/cli_util.h"
#include "e2e/lm_corpus.h"

namespace fs = std::filesystem;
using tandem::test::run_tandem;
using tandem::test::step_losses;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tandem_jsonl_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

const std::string kTokenizer = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/llama3.json";

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// 40 examples, prompt/response and chat lines, as DIR/qa.jsonl.
fs::path write_examples(const fs::path& dir) {
  std::ofstream f(dir / "qa.jsonl");
  for (int i = 0; i < 40; ++i) {
    if (i % 4 == 3)
      f << R"({"messages": [{"role": "user", "content": "double )" << i << R"("}, {"role": "assistant", "content": ")"
        << 2 * i << R"("}]})" << "\n";
    else
      f << "{\"prompt\": \"What is " << i << " plus one?\", \"response\": \" " << i + 1 << "\"}\n";
  }
  return dir / "qa.jsonl";
}

}  // namespace

TEST(DataJsonlCli, HelpSaysTheFormatTheMaskAndPacking) {
  auto r = run_tandem("data jsonl --help");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* part : {"\"prompt\"", "\"response\"", "\"messages\"", "trained on", ".mask", "--pack",
                           "padded", "attending to itself only", "--template", "{role}", "{content}",
                           "chat_template", "--skip-long", "never truncated"})
    EXPECT_TRUE(has(r.output, part)) << part << " missing from:\n" << r.output;
}

TEST(DataJsonlCli, ErrorsNameTheLineOrTheTemplate) {
  const fs::path dir = temp_dir("errors");
  const std::string out = (dir / "out").string();
  auto data = [&](const std::string& file, const std::string& more = "") {
    return run_tandem("data jsonl " + file + " --tokenizer " + kTokenizer + " -o " + out + " " + more);
  };
  std::ofstream(dir / "bad.jsonl") << "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"a\", \"response\"\n";
  auto r = data((dir / "bad.jsonl").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "tandem: error: '" + (dir / "bad.jsonl").string() + "' line 2 is not JSON")) << r.output;

  std::ofstream(dir / "missing.jsonl") << "{\"prompt\": \"a\", \"response\": \"b\"}\n\n{\"prompt\": \"a\"}\n";
  r = data((dir / "missing.jsonl").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "tandem: error: '" + (dir / "missing.jsonl").string() + "' line 3 has no \"response\""))
      << r.output;

  std::ofstream(dir / "chat.jsonl")
      << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})" << "\n"
      << R"({"messages": [{"role": "user", "content": "bye"}, {"role": "assistant", "content": "goodbye"}]})" << "\n";
  r = data((dir / "chat.jsonl").string(), "--template-file " + (dir / "no_such_template.txt").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "tandem: error: cannot read --template-file")) << r.output;
  r = data((dir / "chat.jsonl").string(), "--template '<|{role}|>'");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "tandem: error: --template '<|{role}|>' has no {content}")) << r.output;

  // A tokenizer_config.json whose chat_template is a Jinja program: refused, pointing at --template, which
  // then does it.
  const fs::path tok_dir = dir / "tok";
  fs::create_directories(tok_dir);
  fs::copy_file(kTokenizer, tok_dir / "tokenizer.json");
  std::ofstream(tok_dir / "tokenizer_config.json")
      << R"({"chat_template": "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %})"
      << R"({{ message['content'] }}{% endfor %}"})";
  const std::string with_config = "data jsonl " + (dir / "chat.jsonl").string() + " --tokenizer " +
                                  (tok_dir / "tokenizer.json").string() + " -o " + out;
  r = run_tandem(with_config);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r.output, "tandem: error: the chat_template of '" + (tok_dir / "tokenizer_config.json").string() +
                                "' is a Jinja program tandem cannot run")) << r.output;
  EXPECT_TRUE(has(r.output, "--template")) << r.output;
  r = run_tandem(with_config + " --template '### {role}:\\n{content}\\n'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r.output, "chats rendered with --template")) << r.output;
  EXPECT_TRUE(fs::exists(dir / "out" / "train_000000.mask"));
  fs::remove_all(dir);
}

TEST(LmJsonlTrain, LlamaTrainsOnTheMaskedWindowsAndResumes) {
  const fs::path dir = temp_dir("train");
  const std::string data = (dir / "qa").string();
  auto made = run_tandem("data jsonl " + write_examples(dir).string() + " --tokenizer " + kTokenizer + " -o " + data +
                         " --context 32 --val 0.1");
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_TRUE(has(made.output, "train: 36 examples in 36 windows of 33 tokens")) << made.output;
  EXPECT_TRUE(has(made.output, "val: 4 examples in 4 windows of 33 tokens")) << made.output;

  const std::string run = "train --model llama --layers 1 --width 32 --heads 2 --kv-heads 1 --mlp-hidden 64 "
                          "--data " + data + " --steps 5 --batch-size 4 --lr 3e-3 --eval-every 0 --eval-steps 1 "
                          "--threads 1 --seed 2 ";
  auto a = run_tandem(run + "--context 32 --checkpoint " + (dir / "a.ck").string());
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(step_losses(a.output).size(), 5u) << a.output;
  EXPECT_TRUE(has(a.output, "context 32")) << a.output;
  EXPECT_TRUE(has(a.output, "tandem: loss mask (" + data + "/meta.json): the loss is taken on")) << a.output;
  EXPECT_TRUE(has(a.output, "36 windows of 33 tokens (one example each, padded)")) << a.output;
  EXPECT_TRUE(has(a.output, "step 5/5 | validation loss")) << a.output;

  // The context comes from the data; another is refused.
  auto wrong = run_tandem(run + "--context 16");
  EXPECT_EQ(wrong.status, 2) << wrong.output;
  EXPECT_TRUE(has(wrong.output, "tandem: error: --context 16 differs from the context 32")) << wrong.output;

  // Stopped after 2 steps and resumed: the same windows, the same weights as the run of 5.
  const std::string b = (dir / "b.ck").string();
  auto s = run_tandem(run + "--checkpoint " + b + " --stop-at 2");
  ASSERT_EQ(s.status, 0) << s.output;
  auto r = run_tandem(run + "--checkpoint " + b + " --resume");
  ASSERT_EQ(r.status, 0) << r.output;
  auto la = step_losses(a.output), lr = step_losses(r.output);
  for (int step = 3; step <= 5; ++step) EXPECT_EQ(lr[step], la[step]) << "step " << step;
  tandem::test::expect_same_tensors(b, (dir / "a.ck").string(), "a resumed run on masked data");
  fs::remove_all(dir);
}

// Packed windows give each example what a padded window gives it: the same validation loss over the same
// examples (the model after one step of a negligible rate, the same in both runs), where attending across
// examples or counting positions from the window's start would change it.
TEST(LmJsonlTrain, PackedExamplesGiveThePaddedValidationLoss) {
  const fs::path dir = temp_dir("pack");
  const std::string examples = write_examples(dir).string();
  for (const char* mode : {"pad", "pack"}) {
    auto made = run_tandem("data jsonl " + examples + " --tokenizer " + kTokenizer + " -o " + (dir / mode).string() +
                           " --context 48 --val 0.2" + (std::string(mode) == "pack" ? " --pack" : ""));
    ASSERT_EQ(made.status, 0) << made.output;
  }
  std::map<std::string, std::string> val;
  for (const char* model : {"llama --kv-heads 1 --mlp-hidden 64", "gpt"}) {
    for (const char* mode : {"pad", "pack"}) {
      auto r = run_tandem(std::string("train --model ") + model + " --layers 2 --width 32 --heads 2 --data " +
                          (dir / mode).string() + " --steps 1 --batch-size 4 --lr 1e-9 --eval-steps 20 --threads 1 "
                          "--seed 4");
      ASSERT_EQ(r.status, 0) << r.output;
      const size_t at = r.output.find("validation loss ");
      ASSERT_NE(at, std::string::npos) << r.output;
      val[mode] = r.output.substr(at, 22);
      if (std::string(mode) == "pack")
        EXPECT_TRUE(has(r.output, "whole examples packed, each attending to itself only")) << r.output;
      else
        EXPECT_TRUE(has(r.output, "one example each, padded")) << r.output;
    }
    EXPECT_EQ(val["pack"], val["pad"]) << model;
  }
  fs::remove_all(dir);
}
