#pragma once
// A small corpus for language-model runs, made by `tandem data text`, and the losses they print.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "e2e/cli_util.h"

namespace tandem::test {

/// Text with a structure a bigram model learns quickly: words of a small vocabulary in a random order
/// (the largest byte is 'y', 121).
inline std::string corpus_text(uint64_t seed, size_t bytes) {
  static const char* words[] = {"the", "king", "and", "queen", "of", "a", "fair", "night", "to", "be", "or", "not",
                                "that", "is", "question", "sweet", "rose", "by", "any", "other", "name"};
  std::string s;
  uint64_t x = seed * 2654435761u + 1;
  while (s.size() < bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += words[(x >> 33) % (sizeof words / sizeof *words)];
    s += (x >> 20) % 9 == 0 ? ".\n" : " ";
  }
  return s;
}

/// The text in capitals: the same words, other bytes.
inline std::string upper_case(std::string s) {
  for (char& ch : s)
    if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  return s;
}

/// A corpus of two works, the second held out for validation: DIR/corpus/{train,val}_000000.bin.
inline std::filesystem::path make_corpus(const std::filesystem::path& dir) {
  std::ofstream(dir / "a_work.txt") << corpus_text(1, 40000);
  std::ofstream(dir / "b_work.txt") << corpus_text(2, 10000);
  const std::filesystem::path out = dir / "corpus";
  auto r = run_tandem("data text " + (dir / "a_work.txt").string() + " " + (dir / "b_work.txt").string() + " -o " +
                      out.string() + " --val 0.2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out / "train_000000.bin")) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out / "val_000000.bin")) << r.output;
  return out;
}

/// The loss of every step line a language-model run printed ("step N/M | loss L |"), by step.
inline std::map<int, double> step_losses(const std::string& out) {
  std::map<int, double> m;
  std::regex re(R"(step (\d+)/\d+ \| loss ([0-9.]+) \|)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    m[std::stoi((*it)[1])] = std::stod((*it)[2]);
  return m;
}

/// The validation losses a language-model run printed ("validation loss L |"), in order.
inline std::vector<double> validation_losses(const std::string& out) {
  std::vector<double> v;
  std::regex re(R"(validation loss ([0-9.]+) \|)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1]));
  return v;
}

/// The last validation loss a run printed (infinity when it printed none).
inline double final_validation_loss(const std::string& out) {
  const auto v = validation_losses(out);
  return v.empty() ? INFINITY : v.back();
}

}  // namespace tandem::test
