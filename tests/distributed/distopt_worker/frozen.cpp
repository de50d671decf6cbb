// The model's frozen parameters (held by no optimizer): sync_parameters gives every rank rank 0's values,
// check_consistency compares them, and ranks that freeze different parameters are told.
#include "tandem/nn/layers.h"
#include "tandem/ops.h"
#include "tandem/random.h"
#include "worker_util.h"

namespace distopt_worker {

void scenario_frozen_sync(const std::shared_ptr<dist::Communicator>& comm) {
  const int rank = comm->rank();
  // A linear layer whose bias is frozen: each rank starts from its own values of both.
  Generator gen(100 + static_cast<uint64_t>(rank));
  auto layer = std::make_shared<nn::Linear>(4, 3, gen);
  layer->to(g_device);
  Tensor weight, bias;
  for (auto& [name, t] : layer->named_parameters()) (name == "bias" ? bias : weight) = t;
  bias.detach().copy_(Tensor::full({3}, 0.5 + rank, DType::f32, g_device));
  bias.requires_grad_(false);
  optim::SgdOptions so;
  so.lr = 0.1;
  so.momentum = 0.9;
  so.weight_decay = 0.1;
  dist::DistOpt opt(std::make_shared<optim::SGD>(std::vector<Tensor>{weight}, so), comm, small_buckets());
  opt.sync_parameters(*layer);
  // Rank 0's values, sent here independently of sync_parameters.
  Tensor want = bias.detach().clone();
  comm->broadcast(want, 0)->wait();
  CHECK_OR_REPORT(bias.detach().cpu().to_vector<float>() == want.cpu().to_vector<float>(),
                  "the frozen bias is not rank 0's after sync_parameters");
  for (int s = 0; s < 2; ++s) {
    Generator data(31 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(s));
    opt.step(sum(layer->forward(Tensor::normal({2, 4}, 0.0, 1.0, data, DType::f32, g_device))));
  }
  CHECK_OR_REPORT(bias.detach().cpu().to_vector<float>() == want.cpu().to_vector<float>(), "the frozen bias moved");
  try {
    opt.check_consistency();
  } catch (const std::exception& e) {
    CHECK_OR_REPORT(false, "the ranks differ after two steps: %s", e.what());
  }
  if (rank == comm->size() - 1) bias.detach().copy_(Tensor::full({3}, 7.0, DType::f32, g_device));
  expect_error("a frozen parameter that differs", rank, [&] { opt.check_consistency(); }, {"bias (frozen)"});
  opt.sync_parameters(*layer);
  opt.check_consistency();
  // Ranks that freeze different parameters are told, not left to reduce different buckets.
  auto other = std::make_shared<nn::Linear>(4, 3, gen);
  other->to(g_device);
  std::vector<Tensor> held;
  for (auto& [name, t] : other->named_parameters()) {
    if (name == "bias" && rank == 0) t.requires_grad_(false);
    if (t.requires_grad()) held.push_back(t);
  }
  dist::DistOpt mixed(std::make_shared<optim::SGD>(held, so), comm, small_buckets());
  expect_error("ranks freezing different parameters", rank, [&] { mixed.sync_parameters(*other); },
               {"freeze different parameters"});
}

}  // namespace distopt_worker
