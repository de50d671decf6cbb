#pragma once
// Internal: cross-rank agreement checks. Each runs the same collectives on every rank and throws
// the same verdict everywhere, so a disagreement ends the job on all ranks instead of hanging it.
#include <string>
#include <vector>

#include "tandem/distributed/communicator.h"
#include "tandem/nn/module.h"

namespace tandem::dist {

/// Throws, saying what differs, unless every rank has the same world size and the same parameters
/// (names, shapes, dtypes), trained (`params`, named by `names`) or frozen, and buffers.
void check_same_model(Communicator& comm, const std::vector<std::string>& names, const std::vector<Tensor>& params,
                      const nn::NamedTensors& frozen, const nn::NamedTensors& buffers);

/// Throws, naming the first tensor that differs and the ranks involved, unless all ranks hold
/// bit-identical values in every tensor.
void check_identical_values(Communicator& comm, const std::vector<Tensor>& tensors,
                            const std::vector<std::string>& names);

}  // namespace tandem::dist
