// Trains the guide's CNN on Fashion-MNIST (or MNIST) with plain SGD on one device.
//   mnist_cnn [cpu|cuda] [data-dir]
#include <cstdio>

#include <tandem/tandem.h>

using namespace tandem;

int main(int argc, char** argv) try {
  Device device = Device::parse(argc > 1 ? argv[1] : "cpu");
  std::string dir = argc > 2 ? argv[2] : "";
  data::Dataset train = data::load_dataset("fashion-mnist", dir, true);
  data::Dataset test = data::load_dataset("fashion-mnist", dir, false);

  nn::ModulePtr model = nn::make_model("cnn", {});
  model->to(device);
  optim::SGD sgd(model->parameters(), {.lr = 0.005, .momentum = 0.9, .weight_decay = 1e-5});
  data::DataLoader train_loader(train, {.batch_size = 64, .device = device});
  data::DataLoader test_loader(test, {.batch_size = 1000, .shuffle = false, .device = device});

  for (int epoch = 0; epoch < 2; ++epoch) {
    model->train();
    train_loader.start_epoch(epoch);
    data::Batch b;
    double loss_sum = 0;
    while (train_loader.next(b)) {
      Tensor loss = softmax_cross_entropy(model->forward(b.x), b.y);
      sgd.zero_grad();
      backward(loss);
      sgd.step();
      loss_sum += loss.item<double>();  // a host sync per step: fine for an example
    }
    model->eval();
    NoGradGuard no_grad;
    int64_t correct = 0, seen = 0;
    test_loader.start_epoch(0);
    while (test_loader.next(b)) {
      correct += count_correct(model->forward(b.x), b.y).item<int64_t>();
      seen += b.y.size(0);
    }
    std::printf("epoch %d: loss sum %.3f, test accuracy %.4f\n", epoch, loss_sum, double(correct) / double(seen));
  }
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "mnist_cnn: %s\n", e.what());
  return 2;
}
