// The distributed-training walk-through, in C++: the same program runs on every rank.
//
//   tandem launch -n 2 -- build/bin/dist_train cuda          (one node, two GPUs)
//   mpiexec --hostfile host_file build/bin/dist_train cuda    (one or more nodes)
//   tandem launch -n 2 -- build/bin/dist_train cpu           (two CPU processes over Gloo)
#include <cstdio>

#include <tandem/tandem.h>

using namespace tandem;

int main(int argc, char** argv) try {
  std::string where = argc > 1 ? argv[1] : "cpu";

  // 1. Join the job: the launcher or mpiexec tells each process its rank.
  dist::DistEnv env = dist::detect_env();
  Device dev = where == "cuda" ? Device::cuda(env.local_rank) : Device::cpu();  // rank_in_local picks the GPU
  auto comm = dist::init_communicator(dev);

  // 2. The model and a distributed optimizer wrapping plain SGD.
  nn::ModulePtr model = nn::make_model("cnn", {});
  model->to(dev);
  auto sgd = std::make_shared<optim::SGD>(model->parameters(),
                                          optim::SgdOptions{.lr = 0.005, .momentum = 0.9, .weight_decay = 1e-5});
  dist::DistOpt opt(sgd, comm);

  // 3. Every rank trains and evaluates on its own contiguous 1/world_size of the data.
  data::Dataset train = data::load_dataset("fashion-mnist", "", true);
  data::Dataset test = data::load_dataset("fashion-mnist", "", false);
  data::LoaderOptions lo{.batch_size = 64, .rank = opt.rank_in_global(), .world_size = opt.world_size(), .device = dev};
  data::DataLoader train_loader(train, lo);
  lo.shuffle = false;
  data::DataLoader test_loader(test, lo);

  // 4. All ranks start from rank 0's parameters.
  opt.sync_parameters(*model);

  // 5. Forward, then backward and the distributed update in one call.
  for (int epoch = 0; epoch < 3; ++epoch) {
    if (opt.rank_in_global() == 0) std::printf("Starting Epoch %d:\n", epoch);
    model->train();
    train_loader.start_epoch(epoch);
    data::Batch b;
    while (train_loader.next(b)) {
      Tensor loss = softmax_cross_entropy(model->forward(b.x), b.y);
      opt.backward_and_update(loss);  // or _half, _partial_update, _sparse_update(loss, 0.05, true)
    }
    model->eval();
    NoGradGuard no_grad;
    int64_t correct = 0, seen = 0;
    test_loader.start_epoch(0);
    while (test_loader.next(b)) {
      correct += count_correct(model->forward(b.x), b.y).item<int64_t>();  // a host sync: fine here
      seen += b.y.size(0);
    }
    Tensor totals = Tensor::from_vector(std::vector<int64_t>{correct, seen}, {2}, dev);
    comm->all_reduce(totals)->wait();  // accuracy over every rank's shard
    auto t = totals.to_vector<int64_t>();
    if (opt.rank_in_global() == 0) std::printf("Evaluation accuracy = %f\n", double(t[0]) / double(t[1]));
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "dist_train: %s\n", e.what());
  return e.kind() == Error::Kind::Input ? 2 : 1;
}
