#pragma once
// Hugging Face model directories (config.json and model.safetensors, or shards with their index) in and out:
// GPT-2 (GPT2LMHeadModel) as nn::GPT and Llama (LlamaForCausalLM) as nn::Llama. The names and layouts of each
// family are converted by an adapter of its own (src/nn/pretrained_*.cpp); the models know nothing of them.
#include <string>

#include "tandem/device.h"
#include "tandem/nn/module.h"

namespace tandem::nn {

/// A model read from a Hugging Face directory.
struct Pretrained {
  std::string family;       // "llama" or "gpt2"
  ModulePtr model;          // an nn::Llama or an nn::GPT, its parameters f32 on the device asked for
  std::string config_json;  // the directory's config.json as read (save_pretrained keeps its other fields)
};

/// Reads the model in `dir`. config.json must describe a model tandem represents exactly; anything else is
/// refused naming the field (a hidden_act other than silu, a rope_scaling type other than llama3, a sliding
/// window, an unknown model_type, ...). Every tensor the model needs must be in the files with its shape (any of
/// F32, BF16, F16, F64; converted to f32); one it does not use (other than the buffers transformers writes: the
/// causal masks, rotary inv_freq) is an error naming it. Tensors are copied to the device one at a time from the
/// memory-mapped files. `context` > 0 caps the positions a Llama takes (its rotary tables; default: the config's
/// max_position_embeddings); a GPT's context is its position table's rows. A GPT-2 whose vocab_size is not a
/// multiple of 64 (GPT-2's 50257) is built with its token table padded with zero rows to the next multiple
/// (50304) and logical_vocab the file's vocabulary (GptConfig): its logits, loss, gradients and generations are
/// those of the file's vocabulary, and save_pretrained cuts the padding off again. A Llama keeps the file's
/// vocabulary (Llama 3's 128256 and Llama 2's 32000 are multiples of 64 already). Throws tandem::Error (Input).
Pretrained from_pretrained(const std::string& dir, Device device = Device::cpu(), int64_t context = 0);

/// Writes `model` (an nn::Llama or an nn::GPT) as a Hugging Face directory transformers loads with from_pretrained:
/// config.json (the fields of `config_json` when given, as from_pretrained read them, with the shape's fields set
/// from the model) and model.safetensors in `dtype` (f32, bf16 or f16); a GPT's token table is written without
/// its padding rows (vocab_size its logical_vocab). The directory is created when missing; the two files are
/// replaced whole.
void save_pretrained(Module& model, const std::string& dir, const std::string& config_json = "",
                     DType dtype = DType::f32);

}  // namespace tandem::nn
