#pragma once
// Checkpoints: a model's parameters and buffers and its optimizer's state in one file, so that a
// stopped run can continue where it was. Every tensor and the header carry a CRC-32, so a damaged
// file is refused instead of loaded.
#include <string>
#include <utility>
#include <vector>

#include "tandem/nn/module.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

/// Writes model and optimizer state plus `meta_json` (a JSON object of the caller's own) to path.
/// The file is written as a new file beside path (".NAME.XXXXXXXX.partial", created exclusively, so
/// no link planted there is followed) and renamed over it, so an interrupted save never leaves a
/// damaged checkpoint behind and a link at path is replaced, not written through; a failed save
/// removes the new file.
void save_checkpoint(const std::string& path, const nn::Module& model, optim::Optimizer* opt,
                     const std::string& meta_json = "{}");

/// Writes named tensors and `meta_json` (a JSON object) in the checkpoint format, as save_checkpoint
/// does (beside path, then renamed over it); checkpoint_meta and read_checkpoint_tensors read it back.
/// For state kept beside a checkpoint, such as each rank's own (DistOpt::rank_state).
void save_tensor_file(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::string& meta_json = "{}");

/// Checks, before any work is done, that a checkpoint can be written at path: its directory exists
/// and a file can be created in it (the probe file is created exclusively and removed) and path is
/// not a directory. Throws tandem::Error (Input) saying what to fix.
void check_checkpoint_path(const std::string& path);

/// The meta JSON of a checkpoint, without loading its tensors (to check it suits the run first).
/// The header's checksum is verified.
std::string checkpoint_meta(const std::string& path);

/// Loads what save_checkpoint wrote into model (and opt when given; its state tensors are created
/// on the parameters' devices) and returns the saved meta JSON. Throws tandem::Error naming the file
/// and the problem: not a checkpoint, damaged (and which part), or saved from a model with other
/// parameters. Nothing is changed unless the whole file checks out.
std::string load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* opt);

/// Every tensor of a checkpoint on the CPU, by its stored name ("param/NAME", "buffer/NAME",
/// "opt/KIND/NAME"), in file order, each checksum verified.
std::vector<std::pair<std::string, Tensor>> read_checkpoint_tensors(const std::string& path);

}  // namespace tandem
