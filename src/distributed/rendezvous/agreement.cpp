// Start-up agreement: every rank publishes its fields; rank 0 compares them and publishes one verdict,
// so that every rank stops with the same message (or goes on) at the same point.
#include "tandem/distributed/agreement.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "distributed/rank_list.h"
#include "distributed/rendezvous/group.h"
#include "distributed/rendezvous/net.h"
#include "distributed/rendezvous/store_protocol.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/error.h"

namespace tandem::dist {

namespace {

std::string encode(const std::vector<AgreementField>& fields) {
  std::vector<std::string> parts;
  for (const auto& f : fields) {
    parts.push_back(f.name);
    parts.push_back(f.value);
    parts.push_back(f.must_match ? "1" : "0");
    parts.push_back(f.detail);
  }
  return proto::encode(0, parts);
}

std::vector<AgreementField> decode(const std::string& bytes, int rank) {
  uint8_t code = 0;
  std::vector<std::string> parts;
  TANDEM_RUNTIME_CHECK(bytes.size() >= 4 && proto::decode(bytes.data() + 4, bytes.size() - 4, code, parts) &&
                           parts.size() % 4 == 0,
                       "start-up agreement: rank ", rank, " published a malformed record");
  std::vector<AgreementField> out;
  for (size_t i = 0; i < parts.size(); i += 4) out.push_back({parts[i], parts[i + 1], parts[i + 2] == "1", parts[i + 3]});
  return out;
}

using detail::rank_list;

// "64 on ranks 0, 2; 32 on rank 1": who holds which value, the most common first. With details, each
// rank's follows it: "none on rank 1 (/data/m.ck on node-b)".
std::string who_has_what(const std::map<std::string, std::vector<int>>& by_value,
                         const std::vector<std::string>& details) {
  std::vector<std::pair<std::string, std::vector<int>>> groups(by_value.begin(), by_value.end());
  std::stable_sort(groups.begin(), groups.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::string s;
  for (const auto& [value, ranks] : groups) {
    std::string shown = value.size() > 200 ? value.substr(0, 200) + "..." : value;
    s += (s.empty() ? "" : "; ") + shown + " on ";
    bool detailed = false;
    for (int r : ranks) detailed = detailed || !details[static_cast<size_t>(r)].empty();
    if (!detailed) {
      s += rank_list(ranks);
      continue;
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (i == 4) {
        s += ", ... (" + std::to_string(ranks.size()) + " ranks in all)";
        break;
      }
      const std::string& d = details[static_cast<size_t>(ranks[i])];
      s += (i ? ", rank " : "rank ") + std::to_string(ranks[i]) + (d.empty() ? "" : " (" + d + ")");
    }
  }
  return s;
}

// Rank 0's comparison: "" and the warnings when the ranks agree, else the error.
std::string compare(const std::vector<std::vector<AgreementField>>& all, std::vector<std::string>& warnings) {
  const auto& mine = all[0];
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r].size() != mine.size())
      return "rank " + std::to_string(r) + " compared " + std::to_string(all[r].size()) + " fields and rank 0 " +
             std::to_string(mine.size()) + ": every rank must run the same program";
    for (size_t i = 0; i < mine.size(); ++i)
      if (all[r][i].name != mine[i].name)
        return "rank " + std::to_string(r) + " compared '" + all[r][i].name + "' where rank 0 compared '" +
               mine[i].name + "': every rank must run the same program";
  }
  for (size_t i = 0; i < mine.size(); ++i) {
    std::map<std::string, std::vector<int>> by_value;
    std::vector<std::string> details;
    for (size_t r = 0; r < all.size(); ++r) {
      by_value[all[r][i].value].push_back(static_cast<int>(r));
      details.push_back(all[r][i].detail);
    }
    if (by_value.size() == 1) continue;
    if (mine[i].must_match)
      return mine[i].advice.empty() ? "the ranks were started with different " + mine[i].name + ": " +
                                          who_has_what(by_value, details) +
                                          ". Every rank must be started with the same value"
                                    : "the ranks differ in " + mine[i].name + ": " + who_has_what(by_value, details) +
                                          ". " + mine[i].advice;
    warnings.push_back("the ranks were started with different " + mine[i].name + ": " +
                       who_has_what(by_value, details));
  }
  return "";
}

}  // namespace

std::vector<std::string> check_agreement(Store& store, const std::string& key, int rank, int world_size,
                                         const std::vector<AgreementField>& fields) {
  TANDEM_CHECK(rank >= 0 && rank < world_size, "check_agreement: rank ", rank, " is not in 0 .. ", world_size - 1);
  std::vector<std::string> warnings;
  if (world_size == 1) return warnings;
  store.set(key + "/" + std::to_string(rank), encode(fields));
  std::string verdict;
  if (rank == 0) {
    std::vector<std::vector<AgreementField>> all;
    all.push_back(fields);
    for (int r = 1; r < world_size; ++r)
      all.push_back(decode(store.get(key + "/" + std::to_string(r), store.timeout(),
                                     "rank " + std::to_string(r) + " did not reach the start-up agreement"),
                           r));
    std::string error = compare(all, warnings);
    verdict = error.empty() ? "ok" : "!" + error;
    store.set(key + "/verdict", verdict);
    for (const auto& w : warnings) {
      std::string line = "tandem: warning: " + w + "\n";
      net::write_all(2, line.data(), line.size());
    }
  } else {
    verdict = store.get(key + "/verdict", store.timeout(), "rank 0 did not finish the start-up agreement");
  }
  TANDEM_CHECK(verdict == "ok", verdict.substr(1));
  return warnings;
}

std::vector<std::string> check_agreement(const std::vector<AgreementField>& fields) {
  DistEnv env = detect_env();
  if (env.world_size == 1) return {};
  static std::mutex mu;
  static int calls = 0;
  std::string key;
  {
    std::lock_guard<std::mutex> lock(mu);
    key = detail::key_prefix() + "agreement/" + std::to_string(calls++);
  }
  return check_agreement(rendezvous_store(), key, env.rank, env.world_size, fields);
}

}  // namespace tandem::dist
