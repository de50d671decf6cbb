#pragma once
// Checkpoints: a model's parameters and buffers and its optimizer's state in one file, so that a
// stopped run can continue where it was.
#include <string>

#include "tandem/nn/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

/// Writes model and optimizer state plus `meta_json` (a JSON object of the caller's own) to path.
/// The file is written beside path and renamed over it, so an interrupted save never leaves a
/// damaged checkpoint behind.
void save_checkpoint(const std::string& path, const nn::Module& model, optim::Optimizer* opt,
                     const std::string& meta_json = "{}");

/// The meta JSON of a checkpoint, without loading its tensors (to check it suits the run first).
std::string checkpoint_meta(const std::string& path);

/// Loads what save_checkpoint wrote into model (and opt when given; its state tensors are created
/// on the parameters' devices) and returns the saved meta JSON. Throws tandem::Error naming the file
/// and the problem: not a checkpoint, damaged, or saved from a model with other parameters.
std::string load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt);

}  // namespace tandem
