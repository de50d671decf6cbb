#include "tandem/nn/models.h"

#include "nn/resnet.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

namespace {

/// The guide's MNIST CNN: 431,080 parameters for 1x28x28 inputs and 10 classes.
class Cnn : public Module, public LayerGroups {
 public:
  explicit Cnn(const ModelConfig& cfg) {
    Generator gen(cfg.seed);
    TANDEM_CHECK(cfg.height >= 16 && cfg.width >= 16, "model cnn needs images of at least 16x16, got ", cfg.height,
                 "x", cfg.width);
    // Each ReLU is fused into the layer before it.
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(cfg.in_channels, 20, 5, gen, 1, 0, true, true));
    conv2_ = register_module("conv2", std::make_shared<Conv2d>(20, 50, 5, gen, 1, 0, true, true));
    int64_t h = ((cfg.height - 4) / 2 - 4) / 2, w = ((cfg.width - 4) / 2 - 4) / 2;
    linear1_ = register_module("linear1", std::make_shared<Linear>(50 * h * w, 500, gen, true, true));
    linear2_ = register_module("linear2", std::make_shared<Linear>(500, cfg.num_classes, gen));
    groups_[0] = LayerGroup("conv1", conv1_->parameters());
    groups_[1] = LayerGroup("conv2", conv2_->parameters());
    groups_[2] = LayerGroup("linear1", linear1_->parameters());
    groups_[3] = LayerGroup("linear2", linear2_->parameters());
  }

  Tensor forward(const Tensor& x) override {
    Pool2dOptions pool{{2, 2}, {2, 2}, {0, 0}};
    Tensor h = groups_[0].run(x, [&](const Tensor& in) { return max_pool2d(conv1_->forward(in), pool); });
    h = groups_[1].run(h, [&](const Tensor& in) { return max_pool2d(conv2_->forward(in), pool); });
    h = groups_[2].run(h, [&](const Tensor& in) { return linear1_->forward(flatten(in, 1)); });
    return groups_[3].run(h, [&](const Tensor& in) { return linear2_->forward(in); });
  }

  std::vector<LayerGroup*> layer_groups() override { return {&groups_[0], &groups_[1], &groups_[2], &groups_[3]}; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<Linear> linear1_, linear2_;
  LayerGroup groups_[4];  // each layer
};

ModulePtr make_mlp(const ModelConfig& cfg) {
  Generator gen(cfg.seed);
  auto seq = std::make_shared<Sequential>();
  seq->add(std::make_shared<Flatten>());
  int64_t in = cfg.in_channels * cfg.height * cfg.width;
  std::vector<int64_t> hidden = cfg.hidden.empty() ? std::vector<int64_t>{512, 512} : cfg.hidden;
  for (int64_t h : hidden) {
    TANDEM_CHECK(h > 0, "mlp hidden sizes must be positive, got ", h);
    seq->add(std::make_shared<Linear>(in, h, gen));
    seq->add(std::make_shared<ReLU>());  // a module of its own: parameter names count layers
    in = h;
  }
  seq->add(std::make_shared<Linear>(in, cfg.num_classes, gen));
  seq->group_layers();
  return seq;
}

/// The bigram language model: the logits of the token after token t are row t of one table. It
/// learns the corpus's next-token frequencies (its best loss is their conditional entropy) and nothing
/// of a longer context.
class Bigram : public Module, public LayerGroups {
 public:
  explicit Bigram(const ModelConfig& cfg) : vocab_(cfg.gpt.vocab) {
    TANDEM_CHECK(vocab_ >= 2 && vocab_ <= 65536, "model bigram: the vocabulary must hold 2 to 65536 tokens, got ",
                 vocab_);
    Generator gen(cfg.seed);
    table_ = register_module("table", std::make_shared<Embedding>(vocab_, vocab_, gen));
    group_ = LayerGroup("table", table_->parameters());
  }

  Tensor forward(const Tensor& x) override {
    TANDEM_CHECK(x.dim() == 2 && (x.dtype() == DType::i32 || x.dtype() == DType::i64), "model bigram: takes tokens ",
                 "i32 or i64 [B, T], got ", x.str());
    return group_.run(x, [&](const Tensor& in) { return table_->forward(in); });
  }

  std::vector<LayerGroup*> layer_groups() override { return {&group_}; }

  std::string describe() const override { return detail::cat("Bigram(vocab ", vocab_, ")"); }

 private:
  int64_t vocab_;
  std::shared_ptr<Embedding> table_;
  LayerGroup group_;
};

}  // namespace

std::vector<std::string> model_names() {
  return {"cnn", "mlp", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "bigram", "gpt", "llama"};
}

std::vector<std::string> language_model_names() {
  std::vector<std::string> out;
  for (const std::string& name : model_names())
    if (is_language_model(name)) out.push_back(name);
  return out;
}

bool is_language_model(const std::string& name) { return name == "bigram" || name == "gpt" || name == "llama"; }

ModulePtr make_model(const std::string& name, const ModelConfig& cfg) {
  if (name == "gpt") return std::make_shared<GPT>(cfg.gpt, cfg.seed);
  if (name == "llama") return std::make_shared<Llama>(cfg.llama, cfg.seed);
  TANDEM_CHECK(cfg.in_channels > 0 && cfg.height > 0 && cfg.width > 0 && cfg.num_classes > 1,
               "invalid model input geometry");
  if (name == "cnn") return std::make_shared<Cnn>(cfg);
  if (name == "mlp") return make_mlp(cfg);
  if (name == "bigram") return std::make_shared<Bigram>(cfg);
  for (int depth : {18, 34, 50, 101, 152})
    if (name == "resnet" + std::to_string(depth)) return make_resnet(depth, cfg);
  TANDEM_CHECK(false, "unknown model '", name, "' (choose cnn, mlp, resnet18, resnet34, resnet50, resnet101, ",
               "resnet152, bigram, gpt or llama)");
}

}  // namespace tandem::nn
