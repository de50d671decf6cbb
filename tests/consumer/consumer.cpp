// Trains a small model for a few steps with the installed library; exits 0 only when the loss fell
// and a checkpoint round trip gave back the same parameters.
#include <tandem/checkpoint.h>
#include <tandem/tandem.h>
#include <tandem/version.h>

#include <cstdio>
#include <filesystem>

int main(int argc, char** argv) {
  using namespace tandem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer CHECKPOINT_PATH\n");
    return 2;
  }
  nn::ModelConfig cfg;
  cfg.height = cfg.width = 4;
  cfg.hidden = {16};
  auto model = nn::make_model("mlp", cfg);
  optim::SGD sgd(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator gen(1);
  Tensor x = Tensor::normal({8, 1, 4, 4}, 0.0, 1.0, gen);
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    Tensor loss = softmax_cross_entropy(model->forward(x), y);
    (step == 0 ? first : last) = loss.item<double>();
    sgd.zero_grad();
    backward(loss);
    sgd.step();
  }
  save_checkpoint(argv[1], *model, &sgd);
  auto copy = nn::make_model("mlp", cfg);
  load_checkpoint(argv[1], *copy, nullptr);
  bool same = model->parameters()[0].to_vector<float>() == copy->parameters()[0].to_vector<float>();
  std::printf("tandem %s: loss %.4f -> %.4f, checkpoint %s\n", build_info().version, first, last,
              same ? "round trip ok" : "DIFFERS");
  return last < first && same ? 0 : 1;
}
