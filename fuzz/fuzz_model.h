#pragma once
// The model whose checkpoints the checkpoint harness and its seeds use: small, so runs are fast.
#include "tandem/nn/models.h"

namespace tandem::fuzz {

inline nn::ModulePtr small_model() {
  nn::ModelConfig c;
  c.in_channels = 1;
  c.height = c.width = 2;
  c.num_classes = 2;
  c.hidden = {3};
  return nn::make_model("mlp", c);
}

}  // namespace tandem::fuzz
