#pragma once
// Internal: the memory plan's model of a language model's step, op by op (memory_plan_model.cpp builds it from the
// shape; memory_plan.cpp walks the step over it). The tensors and their dtypes are those the ops in src/ops
// allocate.
#include <cstdint>
#include <string>
#include <vector>

#include "cli/memory_plan.h"

namespace tandem::cli::plan {

// The bytes the device's caching allocator holds for a tensor of numel elements of dtype dt.
int64_t rounded(int64_t numel, DType dt);

// One tensor as the allocator holds it.
struct Buf {
  int64_t numel = 0;
  DType dtype = DType::f32;
  int64_t bytes() const { return rounded(numel, dtype); }
};

int64_t bytes_of(const std::vector<Buf>& v);

// One op of the forward pass, as its backward will find it.
struct Op {
  std::string what;            // "block 3's MLP"
  std::vector<Buf> saved;      // kept for its backward (a tensor several ops keep is listed once)
  std::vector<Buf> fwd_tmp;    // forward: held while it runs, freed after (its output when no later op keeps it)
  std::vector<Buf> bwd_tmp;    // backward: scratch freed when it returns
  std::vector<Buf> bwd_out;    // backward: the gradients it hands on (held until the op before takes them)
  std::vector<Buf> bwd_keep;   // backward: held to the end of the pass (a tied token table's gradient)
  std::vector<Buf> remade;     // of saved: what selective recompute frees at its block's close and makes again
                               // when the block's backward begins (a norm's or SwiGLU's output)
  bool passes_grad = false;    // hands its incoming gradient on unchanged (a residual connection's)
  bool alias = false;          // an add: the incoming gradient goes to both inputs (the branch's is an alias)
  std::vector<int> params;     // the parameters whose gradients its backward makes
};

// A layer group's part of the step: the embeddings, one transformer block, the head.
struct Stage {
  int group = 0;
  bool block = false;
  Buf input;  // a block's input, the residual stream (kept by its first norm, or by recompute)
  std::vector<Op> ops;
};

struct Model {
  std::vector<PlannedParam> params;
  std::vector<Stage> stages;
  Buf stream;              // the residual stream of one micro-batch [B, T, width]
  int64_t tied_table = -1;  // the token table when it is also the output layer (its gradient waits for both)
  int64_t persistent = 0;  // buffers the model keeps beside its parameters (rotary tables)
};

// ---- the model, op by op

struct Dtypes {
  DType act = DType::f32;     // the residual stream and the products' outputs
  bool half = false;          // 16-bit products on a GPU
  bool copies = false;        // the products read kept 16-bit weight copies
  bool weight_saved = false;  // each product keeps its own 16-bit copy of its weight for backward (no kept copies)
};

Dtypes dtypes_of(const MemoryPlanSettings& s);

/// The model of the step: every stage (embeddings, blocks, head) with its ops, from the settings' shape.
Model build_model(const MemoryPlanSettings& s);

}  // namespace tandem::cli::plan
