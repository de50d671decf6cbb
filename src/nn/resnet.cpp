// Residual networks (He et al.): basic blocks for 18/34 layers, bottleneck blocks (stride on the 3x3
// convolution) for 50/101/152. Inputs of 64 pixels and more get the ImageNet stem (7x7 convolution,
// stride 2, then 3x3 max-pooling); smaller ones (CIFAR, MNIST) a 3x3 convolution of stride 1.
#include "nn/resnet.h"

#include "tandem/autograd.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

namespace {

// Batch normalisation, ReLU and the residual add run fused: one pass over the activation each way.
Tensor bn_relu(BatchNorm2d& bn, const Tensor& x) { return bn.forward_act(x, Tensor(), true); }

class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in, int64_t out, int stride, Generator& gen) {
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(in, out, 3, gen, stride, 1, false));
    bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(out));
    conv2_ = register_module("conv2", std::make_shared<Conv2d>(out, out, 3, gen, 1, 1, false));
    bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      down_conv_ = register_module("downsample_conv", std::make_shared<Conv2d>(in, out, 1, gen, stride, 0, false));
      down_bn_ = register_module("downsample_bn", std::make_shared<BatchNorm2d>(out));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = bn_relu(*bn1_, conv1_->forward(x));
    Tensor skip = down_conv_ ? down_bn_->forward(down_conv_->forward(x)) : x;
    return bn2_->forward_act(conv2_->forward(h), skip, true);
  }
  std::string describe() const override { return "BasicBlock"; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, down_conv_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, down_bn_;
};

class Bottleneck : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t width, int stride, Generator& gen) {
    int64_t out = width * kExpansion;
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(in, width, 1, gen, 1, 0, false));
    bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(width));
    conv2_ = register_module("conv2", std::make_shared<Conv2d>(width, width, 3, gen, stride, 1, false));
    bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(width));
    conv3_ = register_module("conv3", std::make_shared<Conv2d>(width, out, 1, gen, 1, 0, false));
    bn3_ = register_module("bn3", std::make_shared<BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      down_conv_ = register_module("downsample_conv", std::make_shared<Conv2d>(in, out, 1, gen, stride, 0, false));
      down_bn_ = register_module("downsample_bn", std::make_shared<BatchNorm2d>(out));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = bn_relu(*bn1_, conv1_->forward(x));
    h = bn_relu(*bn2_, conv2_->forward(h));
    Tensor skip = down_conv_ ? down_bn_->forward(down_conv_->forward(x)) : x;
    return bn3_->forward_act(conv3_->forward(h), skip, true);
  }
  std::string describe() const override { return "Bottleneck"; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_, down_conv_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, bn3_, down_bn_;
};

class ResNet : public Module, public LayerGroups, public BlockRecompute {
 public:
  ResNet(const std::vector<int>& blocks, bool bottleneck, const ModelConfig& cfg) {
    Generator gen(cfg.seed);
    imagenet_stem_ = cfg.height >= 64 && cfg.width >= 64;
    if (imagenet_stem_)
      stem_conv_ = register_module("conv1", std::make_shared<Conv2d>(cfg.in_channels, 64, 7, gen, 2, 3, false));
    else
      stem_conv_ = register_module("conv1", std::make_shared<Conv2d>(cfg.in_channels, 64, 3, gen, 1, 1, false));
    stem_bn_ = register_module("bn1", std::make_shared<BatchNorm2d>(64));
    int64_t in = 64;
    const int64_t widths[4] = {64, 128, 256, 512};
    for (int stage = 0; stage < 4; ++stage) {
      auto seq = std::make_shared<Sequential>();
      for (int b = 0; b < blocks[static_cast<size_t>(stage)]; ++b) {
        int stride = (b == 0 && stage > 0) ? 2 : 1;
        if (bottleneck) {
          seq->add(std::make_shared<Bottleneck>(in, widths[stage], stride, gen));
          in = widths[stage] * Bottleneck::kExpansion;
        } else {
          seq->add(std::make_shared<BasicBlock>(in, widths[stage], stride, gen));
          in = widths[stage];
        }
      }
      stages_.push_back(register_module("layer" + std::to_string(stage + 1), seq));
    }
    fc_ = register_module("fc", std::make_shared<Linear>(in, cfg.num_classes, gen));
    // Layer groups: the stem, each residual block, the classifier.
    std::vector<Tensor> stem = stem_conv_->parameters();
    for (const Tensor& t : stem_bn_->parameters()) stem.push_back(t);
    groups_.emplace_back("stem", stem);
    for (size_t s = 0; s < stages_.size(); ++s)
      for (size_t b = 0; b < stages_[s]->size(); ++b)
        groups_.emplace_back("layer" + std::to_string(s + 1) + "." + std::to_string(b),
                             stages_[s]->layers()[b]->parameters());
    groups_.emplace_back("fc", fc_->parameters());
  }

  Tensor forward(const Tensor& x) override {
    size_t g = 0;
    Tensor h = groups_[g++].run(x, [&](const Tensor& in) {
      Tensor out = bn_relu(*stem_bn_, stem_conv_->forward(in));
      return imagenet_stem_ ? max_pool2d(out, Pool2dOptions{{3, 3}, {2, 2}, {1, 1}}) : out;
    });
    const bool again = recompute_ == RecomputePolicy::full && is_training();
    for (auto& s : stages_)
      for (const ModulePtr& block : s->layers())
        h = groups_[g++].run(h, [&](const Tensor& in) {
          if (!again) return block->forward(in);
          Module* b = block.get();  // kept alive by the model, which outlives the step
          return recompute([b](const Tensor& t) { return b->forward(t); }, in, block->parameters());
        });
    return groups_[g].run(h, [&](const Tensor& in) {
      int kh = static_cast<int>(in.size(2)), kw = static_cast<int>(in.size(3));
      Tensor pooled = avg_pool2d(in, Pool2dOptions{{kh, kw}, {kh, kw}, {0, 0}});  // global average
      return fc_->forward(flatten(pooled, 1));
    });
  }

  void set_recompute(RecomputePolicy policy) override {
    TANDEM_CHECK(policy != RecomputePolicy::selective, "--recompute selective frees transformer blocks' norm and ",
                 "SwiGLU outputs; a ResNet takes none or full (each residual block run again in backward)");
    recompute_ = policy;
  }

  std::vector<LayerGroup*> layer_groups() override {
    std::vector<LayerGroup*> out;
    for (LayerGroup& g : groups_) out.push_back(&g);
    return out;
  }

 private:
  bool imagenet_stem_;
  std::shared_ptr<Conv2d> stem_conv_;
  std::shared_ptr<BatchNorm2d> stem_bn_;
  std::vector<std::shared_ptr<Sequential>> stages_;
  std::shared_ptr<Linear> fc_;
  std::vector<LayerGroup> groups_;
  RecomputePolicy recompute_ = RecomputePolicy::none;
};

}  // namespace

ModulePtr make_resnet(int depth, const ModelConfig& cfg) {
  switch (depth) {
    case 18: return std::make_shared<ResNet>(std::vector<int>{2, 2, 2, 2}, false, cfg);
    case 34: return std::make_shared<ResNet>(std::vector<int>{3, 4, 6, 3}, false, cfg);
    case 50: return std::make_shared<ResNet>(std::vector<int>{3, 4, 6, 3}, true, cfg);
    case 101: return std::make_shared<ResNet>(std::vector<int>{3, 4, 23, 3}, true, cfg);
    case 152: return std::make_shared<ResNet>(std::vector<int>{3, 8, 36, 3}, true, cfg);
    default: TANDEM_CHECK(false, "no ResNet of depth ", depth, " (18, 34, 50, 101 or 152)");
  }
}

}  // namespace tandem::nn
