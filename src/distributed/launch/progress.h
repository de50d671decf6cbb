#pragma once
// Internal: each rank's progress (its last reported step and how many collectives it issued),
// published to the job's store by a background thread, so that a collective that times out can name
// the rank that stopped instead of only the rank that waited.
#include <string>

#include "tandem/distributed/store.h"

namespace tandem::dist::detail {

/// Starts, once per process, the thread that publishes this rank's progress under `prefix` in the
/// store at host:port (over a connection of its own, so that it never waits behind other requests).
void start_progress_publisher(const std::string& host, int port, const StoreAuth& auth, const std::string& prefix,
                              int rank, int world_size);
/// Counts a collective this rank issued (an atomic increment).
void note_collective();
/// A sentence about the ranks that are behind this one, from what they published, e.g.
/// ": rank 1 made no progress since step 412 (this rank is at step 413)"; "" when nothing is known.
std::string stalled_ranks_note();

}  // namespace tandem::dist::detail
