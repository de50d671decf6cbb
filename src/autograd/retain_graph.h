#pragma once
// Keeping the recorded graph through backward, for callers that may run backward over it again.

namespace tandem {

/// While alive on a thread, backward on that thread keeps the graph it walks (the tensors its ops
/// saved), so that a later backward from the same loss, or from a tensor that shares part of its
/// graph, can run over it again; the graph is freed when the last tensor referring to it goes.
/// Without it, backward frees each op's saved tensors as it passes (the default).
class RetainGraphGuard {
 public:
  RetainGraphGuard();
  ~RetainGraphGuard();
  RetainGraphGuard(const RetainGraphGuard&) = delete;
  RetainGraphGuard& operator=(const RetainGraphGuard&) = delete;

 private:
  bool prev_;
};

/// True while a RetainGraphGuard is alive on this thread.
bool retaining_graph();

}  // namespace tandem
