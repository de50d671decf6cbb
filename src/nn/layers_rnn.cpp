// Embedding and recurrent layers.
#include <cmath>

#include "tandem/nn/layers.h"

namespace tandem::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t dim, Generator& gen, bool uniform) {
  TANDEM_CHECK(num_embeddings > 0 && dim > 0, "Embedding: num_embeddings (", num_embeddings, ") and dim (", dim,
               ") must be positive");
  weight = register_parameter("weight", uniform ? Tensor::uniform({num_embeddings, dim}, -1.0, 1.0, gen)
                                                : Tensor::normal({num_embeddings, dim}, 0.0, 1.0, gen));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }

std::string Embedding::describe() const { return detail::cat("Embedding(", weight.size(0), " x ", weight.size(1), ")"); }

RecurrentNet::RecurrentNet(int64_t input_size, const RnnOptions& opt, Generator& gen)
    : opt_(opt), input_size_(input_size), dropout_gen_(gen.next_below(uint64_t(1) << 62)) {
  TANDEM_CHECK(input_size > 0 && opt.hidden_size > 0 && opt.num_layers > 0, "recurrent layer: input_size (",
               input_size, "), hidden_size (", opt.hidden_size, ") and num_layers (", opt.num_layers,
               ") must be positive");
  TANDEM_CHECK(opt.dropout >= 0.0 && opt.dropout < 1.0, "recurrent layer: dropout ", opt.dropout, " outside [0, 1)");
  const int64_t g = rnn_gate_count(opt.mode), h = opt.hidden_size, dirs = opt.bidirectional ? 2 : 1;
  const double bound = 1.0 / std::sqrt(static_cast<double>(h));
  for (int64_t l = 0; l < opt.num_layers; ++l) {
    const int64_t in = l == 0 ? input_size : dirs * h;
    for (int64_t d = 0; d < dirs; ++d) {
      const std::string suffix = "_l" + std::to_string(l) + (d == 1 ? "_reverse" : "");
      auto add = [&](const std::string& name, const Shape& shape) {
        weights_.push_back(register_parameter(name + suffix, Tensor::uniform(shape, -bound, bound, gen)));
      };
      add("weight_ih", {g * h, in});
      add("weight_hh", {g * h, h});
      if (opt.bias) {
        add("bias_ih", {g * h});
        add("bias_hh", {g * h});
      }
    }
  }
}

Tensor RecurrentNet::flat_weight() const {
  std::vector<Tensor> flat;
  for (const Tensor& w : weights_) flat.push_back(reshape(w, {w.numel()}));
  return concat(flat, 0);
}

RnnResult RecurrentNet::forward_states(const Tensor& x, const Tensor& hx, const Tensor& cx) {
  RnnOptions o = opt_;
  o.training = is_training();
  return rnn(x, flat_weight(), hx, cx, o, &dropout_gen_);
}

Tensor RecurrentNet::forward(const Tensor& x) { return forward_states(x, Tensor(), Tensor()).y; }

std::string RecurrentNet::describe() const {
  static const char* names[] = {"RNN(tanh", "RNN(relu", "LSTM(", "GRU("};
  const char* name = names[static_cast<int>(opt_.mode)];
  return detail::cat(name, opt_.mode == RnnMode::RnnTanh || opt_.mode == RnnMode::RnnRelu ? ", " : "", input_size_,
                     " -> ", opt_.hidden_size, ", ", opt_.num_layers, " layer(s)",
                     opt_.bidirectional ? ", bidirectional" : "", opt_.batch_first ? ", batch first" : "", ")");
}

namespace {
RnnOptions options_for(RnnMode mode, int64_t hidden, int64_t layers, bool bias, bool batch_first, double dropout,
                       bool bidirectional) {
  RnnOptions o;
  o.mode = mode;
  o.hidden_size = hidden;
  o.num_layers = layers;
  o.bias = bias;
  o.batch_first = batch_first;
  o.dropout = dropout;
  o.bidirectional = bidirectional;
  return o;
}
}  // namespace

RNN::RNN(int64_t input_size, int64_t hidden_size, Generator& gen, int64_t num_layers, bool relu, bool bias,
         bool batch_first, double dropout, bool bidirectional)
    : RecurrentNet(input_size,
                   options_for(relu ? RnnMode::RnnRelu : RnnMode::RnnTanh, hidden_size, num_layers, bias, batch_first,
                               dropout, bidirectional),
                   gen) {}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, Generator& gen, int64_t num_layers, bool bias, bool batch_first,
           double dropout, bool bidirectional)
    : RecurrentNet(input_size, options_for(RnnMode::Lstm, hidden_size, num_layers, bias, batch_first, dropout, bidirectional),
                   gen) {}

GRU::GRU(int64_t input_size, int64_t hidden_size, Generator& gen, int64_t num_layers, bool bias, bool batch_first,
         double dropout, bool bidirectional)
    : RecurrentNet(input_size, options_for(RnnMode::Gru, hidden_size, num_layers, bias, batch_first, dropout, bidirectional),
                   gen) {}

}  // namespace tandem::nn
