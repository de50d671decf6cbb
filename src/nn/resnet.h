#pragma once
// Internal: residual networks for make_model.
#include "tandem/nn/models.h"

namespace tandem::nn {

/// ResNet of the given depth (18, 34, 50, 101, 152) for cfg's inputs and classes.
ModulePtr make_resnet(int depth, const ModelConfig& cfg);

}  // namespace tandem::nn
