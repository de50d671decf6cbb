// A language-model run's set-up before any model exists: where its token shards are and what they say (context,
// vocabulary, loss masks), the shape of the model it builds, its micro-batches per step and its recompute policy.
#include "cli/lm_trainer.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

bool glob_matches(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  const bool any = rc == 0 && g.gl_pathc > 0;
  ::globfree(&g);
  return any;
}

// Context of the bigram model, which has no table of positions and so no length of its own.
constexpr int64_t kBigramContext = 256;

}  // namespace

LmDataSpecs lm_data_specs(const LmTrainConfig& cfg) {
  LmDataSpecs s;
  if (!cfg.data_dir.empty()) {
    TANDEM_CHECK(cfg.train_data.empty() && cfg.val_data.empty(), "--data DIR names both splits (its *train*.bin and ",
                 "*val*.bin shards); --train-data and --val-data name them one by one: give one or the other");
    std::error_code ec;
    TANDEM_CHECK(fs::is_directory(cfg.data_dir, ec), "--data '", cfg.data_dir, "' is not a directory (a shard file "
                 "or a glob pattern goes to --train-data)");
    const std::string train = (fs::path(cfg.data_dir) / "*train*.bin").string();
    const std::string val = (fs::path(cfg.data_dir) / "*val*.bin").string();
    TANDEM_CHECK(glob_matches(train), "--data '", cfg.data_dir, "' holds no training shards (*train*.bin; `tandem ",
                 "data text FILES -o DIR` writes train_000000.bin ...)");
    s.train = train;
    if (glob_matches(val)) s.val = val;
    const fs::path meta = fs::path(cfg.data_dir) / "meta.json";
    if (fs::is_regular_file(meta, ec)) {
      std::ifstream in(meta);
      const auto j = nlohmann::json::parse(in, nullptr, false);
      TANDEM_CHECK(!j.is_discarded() && j.is_object(), "'", meta.string(), "' is not a JSON object (`tandem data text` ",
                   "writes it beside the shards): mend or remove it");
      if (j.contains("vocab_size")) {
        TANDEM_CHECK(j["vocab_size"].is_number_integer() && j["vocab_size"].get<int64_t>() > 0, "'", meta.string(),
                     "' gives vocab_size ", j["vocab_size"].dump(), ": it must be a positive integer");
        s.vocab = j["vocab_size"].get<int64_t>();
        s.vocab_from = meta.string();
      }
      if (j.value("loss_mask", false) == true) {
        TANDEM_CHECK(j.contains("window") && j["window"].is_number_integer() && j["window"].get<int64_t>() >= 2, "'",
                     meta.string(), "' says \"loss_mask\": true but gives window ",
                     j.contains("window") ? j["window"].dump() : std::string("(none)"),
                     ": it must be the tokens of each window, context + 1 (`tandem data jsonl` writes it)");
        s.loss_mask = true;
        s.frame = j["window"].get<int64_t>();
        s.packing = j.value("packing", std::string("pad"));
        s.meta = meta.string();
      }
    }
    return s;
  }
  TANDEM_CHECK(!cfg.train_data.empty(), "a language model trains on token shards: give --data DIR (its *train*.bin ",
               "and *val*.bin files, as `tandem data text` writes them) or --train-data SPEC");
  if (data::holds_both_splits(cfg.train_data)) {
    // nanoGPT's train.bin beside val.bin, llm.c's NAME_train*.bin beside NAME_val*.bin: the directory names
    // its splits, and only the training shards train. Validation comes from it too unless --val-data says.
    LmTrainConfig as_data = cfg;
    as_data.data_dir = cfg.train_data;
    as_data.train_data.clear();
    as_data.val_data.clear();
    s = lm_data_specs(as_data);
    if (!cfg.val_data.empty()) s.val = cfg.val_data;
    s.note = "--train-data '" + cfg.train_data + "' holds training and validation shards: training on " + s.train +
             (cfg.val_data.empty() ? ", validating on " + s.val : " only (--val-data validates)");
    return s;
  }
  s.train = cfg.train_data;
  s.val = cfg.val_data;
  return s;
}

int64_t lm_data_context(const LmTrainConfig& cfg, const LmDataSpecs& data) {
  if (data.frame <= 0) return cfg.context;
  const int64_t theirs = data.frame - 1;
  TANDEM_CHECK(cfg.context == 0 || cfg.context == theirs, "--context ", cfg.context, " differs from the context ",
               theirs, " that '", data.meta, "' was made with (its windows hold ", data.frame, " tokens, one ",
               data.packing == "pack" ? "window of packed examples" : "padded example", " each): leave --context out, ",
               "or make the data again with `tandem data jsonl ... --context ", cfg.context, "`");
  return theirs;
}

data::TokenStream lm_token_stream(const std::string& spec, const LmDataSpecs& data) {
  // Packed examples: the stream marks each example's first token, so that none attends to another.
  data::TokenStream stream(spec, 0, data.loss_mask, data.loss_mask && data.packing == "pack");
  if (!data.loss_mask) {
    // Instruction data read without its meta.json would train on every token of prompts and padding.
    std::error_code ec;
    for (const auto& shard : stream.shards()) {
      const std::string m = data::mask_path(shard->path());
      TANDEM_CHECK(!fs::exists(m, ec), "token shard '", shard->path(), "' has a loss mask beside it ('", m, "', from ",
                   "`tandem data jsonl`), which only --data DIR reads (through DIR/meta.json's \"loss_mask\"): train ",
                   "with --data ", fs::path(shard->path()).parent_path().string(), ", so that the loss is taken on the ",
                   "responses only");
    }
  }
  return stream;
}

data::TokenBatchOptions lm_batch_options(const LmTrainConfig& cfg, const LmDataSpecs& data, int64_t context, int rank,
                                         int world, Device device, bool validation) {
  data::TokenBatchOptions o;
  o.batch = cfg.batch_size;
  o.context = context;
  o.seed = cfg.seed;
  o.rank = rank;
  o.world_size = world;
  o.device = device;
  o.sequential = validation;
  o.frame = data.frame;
  return o;
}

namespace {

// A language model's vocabulary: --vocab, else the one the data directory gives, else `fallback` (the
// configuration's, named by `config`). The data's largest token must be below it.
int64_t lm_vocab(const LmTrainConfig& cfg, const LmDataSpecs& data, int64_t largest, int64_t fallback,
                 const std::string& config) {
  int64_t vocab = fallback;
  std::string from = "the vocabulary of " + config + ", " + std::to_string(fallback);
  if (cfg.vocab > 0) {
    vocab = cfg.vocab;
    from = "--vocab " + std::to_string(cfg.vocab);
  } else if (data.vocab > 0) {
    vocab = data.vocab;
    from = "the vocabulary " + std::to_string(data.vocab) + " that '" + data.vocab_from + "' gives";
  }
  TANDEM_CHECK(largest < vocab, "the data's largest token is ", largest, ", beyond ", from, ": give --vocab ",
               largest + 1, " or more, or data made for this vocabulary");
  return vocab;
}

}  // namespace

nn::GptConfig lm_model_shape(const LmTrainConfig& cfg, int64_t largest, const LmDataSpecs& data) {
  nn::GptConfig g = nn::gpt_config(cfg.gpt_config);
  const bool bigram = cfg.model == "bigram";
  if (cfg.layers > 0) g.layers = cfg.layers;
  if (cfg.heads > 0) g.heads = cfg.heads;
  if (cfg.width > 0) g.width = cfg.width;
  if (cfg.dropout >= 0.0) g.dropout = cfg.dropout;
  if (bigram) g.context = kBigramContext;
  if (cfg.context > 0) g.context = cfg.context;
  TANDEM_CHECK(bigram || g.width % g.heads == 0, "--width ", g.width, " is not a multiple of --heads ", g.heads,
               ": each head takes width / heads features");
  // The bigram's table is vocab x vocab: as small as the data allows.
  const int64_t fallback = bigram ? (largest < 256 ? 256 : largest + 1) : g.vocab;
  g.vocab = lm_vocab(cfg, data, largest, fallback, "--gpt-config " + cfg.gpt_config);
  return g;
}

nn::LlamaConfig lm_llama_shape(const LmTrainConfig& cfg, int64_t largest, const LmDataSpecs& data) {
  nn::LlamaConfig c = nn::llama_config(cfg.llama_config);
  if (cfg.layers > 0) c.layers = cfg.layers;
  if (cfg.heads > 0) c.heads = cfg.heads;
  if (cfg.kv_heads > 0) c.kv_heads = cfg.kv_heads;
  if (cfg.width > 0) c.width = cfg.width;
  if (cfg.mlp_hidden > 0) c.mlp_hidden = cfg.mlp_hidden;
  if (cfg.rope_theta > 0.0) c.rope_theta = cfg.rope_theta;
  if (cfg.untied) c.tied = false;
  if (cfg.dropout >= 0.0) c.dropout = cfg.dropout;
  if (cfg.context > 0) c.context = cfg.context;
  c.vocab = lm_vocab(cfg, data, largest, c.vocab, "--llama-config " + cfg.llama_config);
  nn::check_llama_config(c);
  return c;
}

// The model library's conversions (the same keys tandem generate reads), as JSON values.
nlohmann::json gpt_shape_json(const nn::GptConfig& g) { return nlohmann::json::parse(nn::gpt_config_to_json(g)); }

nn::GptConfig gpt_shape_from_json(const nlohmann::json& j) { return nn::gpt_config_from_json(j.dump()); }

int64_t lm_accumulation(int64_t total, int64_t batch, int64_t context, int world) {
  const int64_t per = batch * context * world;
  if (total == 0) return 1;
  TANDEM_CHECK(total % per == 0, "--total-batch-tokens ", total, " is not a multiple of the tokens of one ",
               "micro-batch on every rank, --batch-size x --context x ranks = ", batch, " x ", context, " x ", world,
               " = ", per, ": use a multiple of ", per, " (", (total / per + 1) * per, " is the next)");
  return total / per;
}

}  // namespace tandem::cli
