#pragma once
// Start-up agreement: before training, the ranks compare what must be the same on every rank (model,
// shapes, batch size, steps per epoch, ...) and stop at once, naming the field and the ranks, instead of
// failing later inside a collective or hanging until its timeout.
#include <string>
#include <vector>

#include "tandem/distributed/store.h"

namespace tandem::dist {

/// One named value a rank was started with.
struct AgreementField {
  std::string name;         // as the user knows it, e.g. "--batch-size"
  std::string value;
  bool must_match = true;   // false: ranks may differ (a seed, a learning rate): a warning, not an error
  std::string detail{};     // not compared; shown beside the rank in a message (the path a rank looked at)
  std::string advice{};     // rank 0's ends the error instead of "Every rank must be started with the same value"
};

/// Compares every rank's fields through the job's rendezvous store; every rank must call it with the
/// same field names, in the same order as its other check_agreement calls. Throws tandem::Error (Input),
/// on every rank, naming the first must-match field that differs and which ranks have which value.
/// Rank 0 writes a warning to stderr for each may-differ field that differs; those warnings are returned
/// on rank 0 (and nothing elsewhere). Does nothing in a job of one process.
std::vector<std::string> check_agreement(const std::vector<AgreementField>& fields);

/// The same over a given store, for the ranks 0 .. world_size - 1 that call it with the same `key`.
std::vector<std::string> check_agreement(Store& store, const std::string& key, int rank, int world_size,
                                         const std::vector<AgreementField>& fields);

}  // namespace tandem::dist
