// Times the CPU kernels of the guide's MNIST CNN at batch 64, one by one and as full training steps
// (forward, backward, SGD with momentum), and checks that the steps change the parameters.
//
//   cpu_kernels_bench [--threads N] [--steps N] [--batch N] [--steps-only 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tandem/ops.h"
#include "tandem/random.h"

using namespace tandem;
using backend::ConvGeom;
using backend::PoolGeom;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over rounds of the mean time of one call, after a warm-up.
double time_it(const std::function<void()>& f, int reps, int rounds = 5) {
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now_s();
    for (int i = 0; i < reps; ++i) f();
    t.push_back((now_s() - t0) / reps);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

ConvGeom conv_geom(int64_t n, int64_t c, int64_t h, int64_t k, int64_t r) {
  return {n, c, h, h, k, r, r, 1, 1, 0, 0, h - r + 1, h - r + 1};
}

PoolGeom pool_geom(int64_t n, int64_t c, int64_t h) { return {n, c, h, h, 2, 2, 2, 2, 0, 0, h / 2, h / 2}; }

struct Param {
  Tensor value, momentum;
};

void kernel_table(int64_t batch) {
  backend::Backend& be = backend::cpu_backend();
  Generator gen(1);
  std::printf("%-34s %10s\n", ("kernel, batch " + std::to_string(batch)).c_str(), "ms");
  auto row = [&](const char* name, const std::function<void()>& f) {
    std::printf("%-34s %10.3f\n", name, time_it(f, 20) * 1e3);
  };
  ConvGeom g1 = conv_geom(batch, 1, 28, 20, 5), g2 = conv_geom(batch, 20, 12, 50, 5);
  Tensor x = Tensor::uniform({batch, 1, 28, 28}, 0, 1, gen);
  Tensor w1 = Tensor::uniform({20, 1, 5, 5}, -0.2, 0.2, gen), b1 = Tensor::zeros({20});
  Tensor y1 = Tensor::empty({batch, 20, 24, 24}), dy1 = Tensor::uniform({batch, 20, 24, 24}, -1, 1, gen);
  Tensor p1 = Tensor::empty({batch, 20, 12, 12}), i1 = Tensor::empty({batch, 20, 12, 12}, DType::i32);
  Tensor w2 = Tensor::uniform({50, 20, 5, 5}, -0.05, 0.05, gen), b2 = Tensor::zeros({50});
  Tensor y2 = Tensor::empty({batch, 50, 8, 8}), dy2 = Tensor::uniform({batch, 50, 8, 8}, -1, 1, gen);
  Tensor dx2 = Tensor::empty({batch, 20, 12, 12}), dw1 = Tensor::empty({20, 1, 5, 5}), db1 = Tensor::empty({20});
  Tensor dw2 = Tensor::empty({50, 20, 5, 5}), db2 = Tensor::empty({50});
  Tensor f = Tensor::uniform({batch, 800}, -1, 1, gen), fw = Tensor::uniform({500, 800}, -0.03, 0.03, gen);
  Tensor fy = Tensor::empty({batch, 500}), fdy = Tensor::uniform({batch, 500}, -1, 1, gen);
  Tensor fdx = Tensor::empty({batch, 800}), fdw = Tensor::empty({500, 800});
  row("conv1 forward", [&] { be.conv2d_forward(x, w1, b1, g1, y1); });
  row("conv1 backward weight+bias", [&] { be.conv2d_backward_weight(dy1, x, g1, dw1, db1); });
  row("relu1 forward", [&] { be.unary(backend::Unary::Relu, y1, y1); });
  row("relu1 backward", [&] { be.unary_backward(backend::Unary::Relu, dy1, y1, dy1); });
  row("pool1 forward", [&] { be.max_pool2d_forward(y1, pool_geom(batch, 20, 24), p1, i1); });
  row("pool1 backward", [&] { be.max_pool2d_backward(p1, y1, p1, i1, pool_geom(batch, 20, 24), dy1); });
  row("conv2 forward", [&] { be.conv2d_forward(p1, w2, b2, g2, y2); });
  row("conv2 backward data", [&] { be.conv2d_backward_data(dy2, w2, g2, dx2); });
  row("conv2 backward weight+bias", [&] { be.conv2d_backward_weight(dy2, p1, g2, dw2, db2); });
  row("fc1 forward (gemm)", [&] { be.gemm(false, true, batch, 500, 800, 1.0, f, fw, 0.0, fy); });
  row("fc1 backward data (gemm)", [&] { be.gemm(false, false, batch, 800, 500, 1.0, fdy, fw, 0.0, fdx); });
  row("fc1 backward weight (gemm)", [&] { be.gemm(true, false, 500, 800, batch, 1.0, fdy, f, 0.0, fdw); });
}

void training_steps(int64_t batch, int steps) {
  Generator gen(7);
  auto param = [&](const Shape& s, double bound) {
    Param p{Tensor::uniform(s, -bound, bound, gen), Tensor::zeros(s)};
    p.value.requires_grad_();
    return p;
  };
  std::vector<Param> ps{param({20, 1, 5, 5}, 0.2),  param({20}, 0.2),       param({50, 20, 5, 5}, 0.045),
                        param({50}, 0.045),        param({500, 800}, 0.035), param({500}, 0.035),
                        param({10, 500}, 0.045),   param({10}, 0.045)};
  Tensor x = Tensor::uniform({batch, 1, 28, 28}, 0, 1, gen);
  std::vector<int32_t> lab(batch);
  for (int64_t i = 0; i < batch; ++i) lab[i] = static_cast<int32_t>(gen.next_below(10));
  Tensor labels = Tensor::from_vector(lab, {batch});
  const std::vector<float> before = ps[4].value.to_vector<float>();
  bool first = true;
  float loss_first = 0, loss_last = 0;
  auto step = [&] {
    Tensor h = max_pool2d(relu(conv2d(x, ps[0].value, ps[1].value)));
    h = max_pool2d(relu(conv2d(h, ps[2].value, ps[3].value)));
    h = relu(linear(flatten(h), ps[4].value, ps[5].value));
    Tensor loss = softmax_cross_entropy(linear(h, ps[6].value, ps[7].value), labels);
    backward(loss);
    std::vector<backend::ParamSlot> slots;
    for (Param& p : ps) slots.push_back({p.value, p.value.grad(), p.momentum, Tensor(), Tensor()});
    backend::cpu_backend().sgd_step(slots.data(), static_cast<int64_t>(slots.size()),
                                    {0.005, 0.9, 0.0, 1e-5, false, first});
    first = false;
    for (Param& p : ps) p.value.set_grad(Tensor());
    loss_last = loss.item<float>();
  };
  step();
  loss_first = loss_last;
  const double t = time_it(step, steps, 3);
  const std::vector<float> after = ps[4].value.to_vector<float>();
  bool changed = false;
  for (size_t i = 0; i < after.size() && !changed; ++i) changed = after[i] != before[i];
  std::printf("training step (batch %lld): %.3f ms, %.0f images/s; loss %.4f -> %.4f; parameters %s\n",
              static_cast<long long>(batch), t * 1e3, batch / t, loss_first, loss_last,
              changed ? "changed" : "DID NOT CHANGE");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0, steps = 100, steps_only = 0;
  int64_t batch = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps-only")) steps_only = std::atoi(argv[i + 1]);
  }
  if (threads > 0) set_num_threads(threads);
  std::printf("threads: %d\n", num_threads());
  if (!steps_only) kernel_table(batch);
  training_steps(batch, steps);
  return 0;
}
