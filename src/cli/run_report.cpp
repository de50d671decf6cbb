#include "cli/run_report.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "tandem/error.h"

namespace tandem::cli {

std::string new_run_id() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string utc_timestamp() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

MetricsFile::MetricsFile(const std::string& path, std::string run_id)
    : path_(path), run_id_(std::move(run_id)), fd_(io::open_for_append(path, "metrics file")) {}

void MetricsFile::write(nlohmann::json j) {
  j["run_id"] = run_id_;
  j["time"] = utc_timestamp();
  j["unix_time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line = j.dump() + "\n";  // one write: lines of runs sharing the file stay whole
  io::write_all(fd_.get(), line.data(), line.size(), path_, "metrics file");
}

void RunSummary::add(const EpochFigures& e) {
  ++epochs_;
  final_acc_ = e.eval_acc;
  if (e.eval_acc > best_acc_) {
    best_acc_ = e.eval_acc;
    best_epoch_ = e.epoch;
  }
  train_s_ += e.train_s;
  samples_ += e.train_samples;
  bytes_ += e.bytes_per_step;
}

namespace {
// 12345.6 -> "12,346": figures a person reads at a glance.
std::string grouped(double v) {
  const std::string digits = std::to_string(static_cast<long long>(v + 0.5));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}
}  // namespace

std::string RunSummary::line(double wall_s) const {
  char buf[256];
  if (epochs_ == 0) {
    std::snprintf(buf, sizeof buf, "done: no epoch to train, %.1f s", wall_s);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "done: %d epoch%s in %.1f s; final accuracy %.4f, best %.4f (epoch %d); %s images/s; ",
                epochs_, epochs_ == 1 ? "" : "s", wall_s, final_acc_, best_acc_, best_epoch_,
                grouped(train_s_ > 0 ? static_cast<double>(samples_) / train_s_ : 0.0).c_str());
  std::string out = buf;
  std::snprintf(buf, sizeof buf, "%.3f MB sent per step", bytes_ / epochs_ / 1e6);
  return out + buf;
}

}  // namespace tandem::cli
