#pragma once
// Sync batch norm: batch normalisation whose training statistics are those of the global batch
// (every rank's samples), not of this rank's share. The per-channel sums are all-reduced in forward
// and the sums backward needs in backward, so with N ranks at batch b a step computes what one rank
// at batch N*b would. For models whose per-rank batch is too small for good statistics.
#include <memory>

#include "tandem/distributed/communicator.h"
#include "tandem/nn/layers.h"

namespace tandem::dist {

/// Batch norm of x [N, C, H, W] in training mode with statistics over every rank of comm: normalises
/// with the global mean and (biased) variance and updates bn's running statistics with them (the
/// variance unbiased), alike on every rank. Computes in f32; 16-bit activations (mixed precision)
/// are converted in and the output back. Every rank must call it for the same layers in the same
/// order, as for any collective.
Tensor sync_batch_norm2d(const Tensor& x, nn::BatchNorm2d& bn, const std::shared_ptr<Communicator>& comm);

/// A BatchNorm2d layer that synchronises its statistics across comm's ranks in training (the same
/// as BatchNorm2d in evaluation, with its running statistics).
class SyncBatchNorm2d : public nn::BatchNorm2d {
 public:
  SyncBatchNorm2d(int64_t channels, std::shared_ptr<Communicator> comm, double momentum = 0.1, double eps = 1e-5);
  std::string describe() const override;
};

/// Makes every BatchNorm2d in model synchronise its statistics across comm's ranks in training;
/// returns how many batch-norm layers the model has. With one rank the layers keep their local
/// computation, which then is the global one.
int convert_sync_batch_norm(nn::Module& model, const std::shared_ptr<Communicator>& comm);

}  // namespace tandem::dist
