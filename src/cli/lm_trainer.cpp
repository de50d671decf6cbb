// `tandem train` for language models: the phases of a run, in the order they run. A single process
// runs the same code with a one-rank communicator.
#include "cli/lm_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>

#include "cli/interrupt.h"
#include "cli/lm_report.h"
#include "cli/trainer.h"
#include "tandem/checkpoint.h"
#include "tandem/distributed/agreement.h"
#include "tandem/distributed/bootstrap.h"
#include "tandem/nn/pretrained.h"
#include "tandem/ops.h"
#include "tandem/optim/optimizer.h"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Where rank r's dropout counters start, beyond rank 0's: 2^48 apart, more than a run draws.
uint64_t rank_counters(int rank) { return static_cast<uint64_t>(rank) << 48; }

int64_t largest_token(const data::TokenStream& s) {
  int64_t m = -1;
  for (const auto& shard : s.shards()) m = std::max<int64_t>(m, shard->max_token());
  return m;
}

std::string host_name() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("this host");
}

// The number as it is written in a meta field read back (a count of tokens, a step).
int64_t meta_int(const nlohmann::json& meta, const char* key, const std::string& path) {
  TANDEM_CHECK(meta.contains(key) && meta[key].is_number_integer(), "checkpoint '", path, "' does not record its ",
               key, " (was it written by tandem train for a language model?)");
  return meta[key].get<int64_t>();
}

}  // namespace

nlohmann::json LmTrainer::shape_json() const {
  return cfg_.model == "llama" ? nlohmann::json::parse(nn::llama_config_to_json(llama_)) : gpt_shape_json(shape_);
}

LmTrainer::LmTrainer(const LmTrainConfig& cfg) : cfg_(cfg) {
  // bf16 is a language model's precision on a GPU (f32 weights and optimizer, bf16 products).
  if (cfg_.precision.empty() && Device::parse(cfg_.device).is_cuda()) cfg_.precision = "bf16";
  // A recorded SGD step replays the rate it was recorded with: a schedule that moves the rate at every
  // step would have the session record steps only to drop them. Adam's recorded steps read the rate from
  // the device (optim::Adam::prepare_replay) and follow the schedule.
  const bool rate_on_device = cfg_.optimizer == "adam" || cfg_.optimizer == "adamw";
  if (cfg_.cuda_graph && Device::parse(cfg_.device).is_cuda() && !rate_on_device &&
      !(cfg_.warmup == 0 && cfg_.min_lr_or_default() == cfg_.lr)) {
    cfg_.cuda_graph = false;
    eager_because_ = "the schedule gives every step another learning rate (a recorded SGD step replays one; "
                     "--warmup 0 and --min-lr equal to --lr keep it constant; adamw follows it)";
  }
}
LmTrainer::~LmTrainer() = default;

int LmTrainer::run() {
  start_ = Clock::now();
  if (!setup()) return 0;
  Session& s = *session_;
  const int64_t last = cfg_.stop_at > 0 ? cfg_.stop_at : cfg_.steps;
  const bool validate = val_batches_ && cfg_.eval_steps > 0;
  s.model().train(true);
  // Ctrl-C / SIGTERM from here on: the ranks agree on a step boundary to stop at and save there.
  InterruptScope interrupts(s.lead(), cfg_.checkpoint.empty()
                                          ? std::string("with nothing to save (no --checkpoint)")
                                          : "saving the checkpoint '" + cfg_.checkpoint + "' there");
  StopAgreement stop(s.comm(), s.device());
  Clock::time_point mark = Clock::now();
  int64_t since = 0;  // steps since the last line
  for (int64_t step = first_step_; step < last; ++step) {
    if (validate && cfg_.eval_every > 0 && step % cfg_.eval_every == 0) {
      auto t0 = Clock::now();
      const double v = evaluate();
      report_eval(step, v, seconds_since(t0));
      mark += Clock::now() - t0;  // the steps' time leaves the evaluation out
    }
    StepResult r = train_step();
    ++since;
    dist::report_step(step + 1);  // lets a timed-out rank name the one that stopped
    if (cfg_.check_consistency > 0 && !s.partial() && (step + 1) % cfg_.check_consistency == 0)
      s.opt().check_consistency(/*include_buffers=*/false);
    if ((step + 1) % cfg_.log_every == 0 || step + 1 == last) {
      synchronize(s.device());  // the steps' device work is part of their time
      report_step(step + 1, r, seconds_since(mark), since);
      mark = Clock::now();
      since = 0;
    }
    if (cfg_.checkpoint_every > 0 && (step + 1) % cfg_.checkpoint_every == 0 && step + 1 != last) {
      auto t0 = Clock::now();
      save_checkpoint(step + 1);
      mark += Clock::now() - t0;
    }
    if (step + 1 < last)
      if (const int sig = stop.at_boundary()) return stop_after(step + 1, sig);
  }
  stop.finish();
  if (validate) {
    auto t0 = Clock::now();
    const double v = evaluate();
    report_eval(last, v, seconds_since(t0));
  }
  save_checkpoint(last);
  if (s.lead()) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "done: %lld steps in %.1f s", static_cast<long long>(last - first_step_),
                  seconds_since(start_));
    std::string line = buf;
    if (last_val_loss_ >= 0.0) {
      std::snprintf(buf, sizeof buf, "; validation loss %.4f", last_val_loss_);
      line += buf;
    }
    if (last < cfg_.steps) line += "; stopped at step " + std::to_string(last) + " of " + std::to_string(cfg_.steps);
    std::fprintf(stderr, "tandem: %s\n", line.c_str());
  }
  report_memory();
  return 0;
}

int LmTrainer::stop_after(int64_t step, int sig) {
  Session& s = *session_;
  synchronize(s.device());
  save_checkpoint(step);  // every rank: each saves its own state beside it
  if (s.lead()) {
    const std::string saved = cfg_.checkpoint.empty()
                                  ? std::string("nothing was saved (no --checkpoint)")
                                  : "saved the checkpoint '" + cfg_.checkpoint + "' (the same command with --resume "
                                    "goes on from there)";
    std::fprintf(stderr, "tandem: interrupted by %s after step %lld of %lld: %s\n", stop_signal_name(sig).c_str(),
                 static_cast<long long>(step), static_cast<long long>(cfg_.steps), saved.c_str());
  }
  return 128 + sig;
}

void LmTrainer::report_memory() {
  Session& s = *session_;
  if (!plan_ || !s.lead()) return;
  // Tensors held at once over the run (a recorded step's own memory counted), beside the plan's peak.
  const MemoryStats m = memory_stats(s.device());
  const int64_t measured = static_cast<int64_t>(m.peak_in_use + m.graphs_peak_in_use);
  std::fprintf(stderr, "tandem: memory: peak %s per rank measured, %s planned (%+.1f%%)\n", format_bytes(measured).c_str(),
               format_bytes(plan_->peak).c_str(),
               measured > 0 ? 100.0 * (static_cast<double>(plan_->peak) / static_cast<double>(measured) - 1.0) : 0.0);
}

bool LmTrainer::setup() {
  if (!cfg_.checkpoint.empty()) {
    const int rank = dist::detect_env().rank;
    if (rank == 0) check_checkpoint_path(cfg_.checkpoint);
    check_checkpoint_path(rank_state_path(cfg_.checkpoint, rank));
  }
  specs_ = lm_data_specs(cfg_);
  // Instruction data fixes the context: its windows hold context + 1 tokens.
  cfg_.context = lm_data_context(cfg_, specs_);
  session_ = std::make_unique<Session>(cfg_);
  Session& s = *session_;
  train_stream_ = lm_token_stream(specs_.train, specs_);
  if (!specs_.val.empty()) val_stream_ = lm_token_stream(specs_.val, specs_);
  const int64_t largest = std::max(largest_token(train_stream_), specs_.val.empty() ? -1 : largest_token(val_stream_));
  // --init DIR: a Hugging Face model's shape is its config.json's (flags that would change it are refused).
  std::optional<nn::Pretrained> init;
  if (!cfg_.init.empty() && std::filesystem::is_directory(cfg_.init)) {
    init = nn::from_pretrained(cfg_.init, Device::cpu(), cfg_.context);
    const std::string kind = init->family == "gpt2" ? "gpt" : init->family;
    TANDEM_CHECK(kind == cfg_.model, "--init '", cfg_.init, "' holds a ", init->family, " model; train it with --model ",
                 kind, " (this run says --model ", cfg_.model, ")");
  }
  nn::ModelConfig mc;
  if (cfg_.model == "llama") {
    llama_ = init ? dynamic_cast<nn::Llama&>(*init->model).config() : lm_llama_shape(cfg_, largest, specs_);
    if (init && cfg_.dropout >= 0.0) llama_.dropout = cfg_.dropout;
    // A Hugging Face model's max_position_embeddings (131,072 for Llama 3) is what it can take, not a window to
    // train on: 2048 unless --context says.
    if (init && cfg_.context == 0) llama_.context = std::min<int64_t>(llama_.context, 2048);
    context_ = llama_.context;
    vocab_ = llama_.vocab;
    mc.llama = llama_;
  } else {
    shape_ = init ? dynamic_cast<nn::GPT&>(*init->model).config() : lm_model_shape(cfg_, largest, specs_);
    if (init && cfg_.context > 0) {
      TANDEM_CHECK(cfg_.context <= shape_.context, "--context ", cfg_.context, " is beyond the ", shape_.context,
                   " positions of --init '", cfg_.init, "'");
    }
    if (init && cfg_.dropout >= 0.0) shape_.dropout = cfg_.dropout;
    context_ = init && cfg_.context > 0 ? cfg_.context : shape_.context;
    vocab_ = shape_.used_vocab();  // a Hugging Face GPT-2's own vocabulary, its table padded (GptConfig)
    mc.gpt = shape_;
  }
  TANDEM_CHECK(largest < vocab_, "the data's largest token is ", largest, ", beyond the vocabulary of ", vocab_,
               init ? " of --init '" + cfg_.init + "'" : std::string(), ": give data made for this vocabulary");
  accumulate_ = lm_accumulation(cfg_.total_batch_tokens, cfg_.batch_size, context_, s.world());
  // The memory plan, before anything of the model is allocated: printed, and a run that would not fit refused.
  if (cfg_.model == "gpt" || cfg_.model == "llama") {
    MemoryPlanSettings ps = s.memory_plan_settings();
    ps.model = cfg_.model;
    if (cfg_.model == "llama") ps.llama = llama_; else ps.gpt = shape_;
    ps.batch = cfg_.batch_size;
    ps.context = context_;
    ps.accumulate = accumulate_;
    ps.eval_batch = specs_.val.empty() || cfg_.eval_steps == 0 ? 0 : cfg_.batch_size;
    ps.checkpoint = !cfg_.checkpoint.empty();
    ps.recompute = nn::parse_recompute(cfg_.recompute);
    // Each split's part of this rank, put on the device once (data::TokenBatches).
    ps.data_bytes = token_data_bytes(train_stream_.size(), train_stream_.width(), train_stream_.masked(),
                                     specs_.loss_mask ? specs_.frame : 0, s.rank(), s.world());
    if (!specs_.val.empty())
      ps.data_bytes += token_data_bytes(val_stream_.size(), val_stream_.width(), val_stream_.masked(),
                                        specs_.loss_mask ? specs_.frame : 0, s.rank(), s.world());
    plan_ = s.plan_memory_or_refuse(ps, /*total_batch_tokens=*/true);
  }
  s.build_model(mc);
  apply_recompute(s, cfg_.recompute);
  if (init) {  // the weights, by name (the model built here is the one from_pretrained built)
    std::map<std::string, Tensor> from;
    for (auto& [name, t] : init->model->named_parameters()) from[name] = t;
    NoGradGuard no_grad;
    for (auto& [name, t] : s.model().named_parameters()) Tensor(t).detach().copy_(from.at(name).to(t.device()));
    hf_config_ = init->config_json;  // kept in the checkpoints: tandem export --format hf starts from it
    init.reset();
  } else if (!cfg_.init.empty()) {  // a tandem checkpoint: its weights (not its optimizer state or step)
    load_checkpoint(cfg_.init, s.model(), nullptr);
  }
  // Every rank drops units of its own: its generators draw from a range of counters of their own.
  for (auto& [name, gen] : s.model().named_generators()) gen->set_offset(gen->offset() + rank_counters(s.rank()));
  s.opt().optimizer().set_schedule(
      std::make_shared<optim::WarmupCosine>(cfg_.lr, cfg_.warmup, cfg_.steps, cfg_.min_lr_or_default()));
  flops_per_token_ = s.model().flops_per_token(context_);
  peak_ = peak_flops(device_name(s.device()), s.precision());
  check_ranks_agree();

  train_batches_ = std::make_unique<data::TokenBatches>(
      train_stream_, lm_batch_options(cfg_, specs_, context_, s.rank(), s.world(), s.device(), false));
  if (!specs_.val.empty())
    val_batches_ = std::make_unique<data::TokenBatches>(
        val_stream_, lm_batch_options(cfg_, specs_, context_, s.rank(), s.world(), s.device(), true));
  x_ = Tensor::empty({cfg_.batch_size, context_}, DType::i32, s.device());
  y_ = Tensor::empty({cfg_.batch_size, context_}, DType::i32, s.device());
  if (train_batches_->documented()) {
    // Packed examples: the model reads each token's position in its example from this buffer, which every
    // draw refills (recorded steps too), and attends within examples only.
    pos_ = Tensor::zeros({cfg_.batch_size, context_}, DType::i32, s.device());
    if (auto* lm = dynamic_cast<nn::CausalLm*>(&s.model())) lm->set_document_positions(pos_);
  }
  step_loss_ = Tensor::zeros({1}, DType::f32, s.device());

  if (cfg_.resume && !resume()) return false;
  s.sync_model();

  if (s.lead()) {
    const int64_t step_tokens = cfg_.batch_size * context_ * accumulate_ * s.world();
    const std::string vocab_note = cfg_.vocab == 0 && specs_.vocab > 0 ? " (" + specs_.vocab_from + "'s)" : "";
    std::fprintf(stderr,
                 "tandem: %s (%s parameters) on %s: %s training / %s validation tokens, vocabulary %lld%s, context %lld; "
                 "%lld x %lld tokens per rank per micro-batch, %lld micro-batch%s per step (%s tokens); %lld steps, "
                 "%s; %s\n",
                 cfg_.model.c_str(), with_commas(s.model().num_parameters()).c_str(), specs_.train.c_str(),
                 with_commas(train_stream_.size()).c_str(), specs_.val.empty() ? "no" : with_commas(val_stream_.size()).c_str(),
                 static_cast<long long>(vocab_), vocab_note.c_str(), static_cast<long long>(context_),
                 static_cast<long long>(cfg_.batch_size), static_cast<long long>(context_),
                 static_cast<long long>(accumulate_), accumulate_ == 1 ? "" : "es", with_commas(step_tokens).c_str(),
                 static_cast<long long>(cfg_.steps), s.opt().optimizer().schedule()->describe().c_str(),
                 s.where().c_str());
    std::fprintf(stderr, "tandem: %s\n", s.memory_line().c_str());
    if (!specs_.note.empty()) std::fprintf(stderr, "tandem: %s\n", specs_.note.c_str());
    if (specs_.loss_mask) {
      const int64_t n = train_stream_.size(), trained = train_stream_.trained();
      std::fprintf(stderr, "tandem: loss mask (%s): the loss is taken on %s of the %s training tokens (%.1f%%); each "
                   "window is one of the data's %s windows of %lld tokens (%s)\n", specs_.meta.c_str(),
                   with_commas(trained).c_str(), with_commas(n).c_str(),
                   n > 0 ? 100.0 * static_cast<double>(trained) / static_cast<double>(n) : 0.0,
                   with_commas(n / specs_.frame).c_str(), static_cast<long long>(specs_.frame),
                   specs_.packing == "pack"
                       ? "whole examples packed, each attending to itself only"
                       : "one example each, padded");
    }
    if (specs_.val.empty())
      std::fprintf(stderr, "tandem: no validation shards: no validation loss is reported\n");
    if (!eager_because_.empty()) std::fprintf(stderr, "tandem: steps run eagerly: %s\n", eager_because_.c_str());
    if (!cfg_.metrics_path.empty()) metrics_.emplace(cfg_.metrics_path, new_run_id());
    if (!cfg_.tensorboard_dir.empty()) board_.emplace(cfg_.tensorboard_dir);
  }
  return true;
}

void LmTrainer::check_ranks_agree() {
  Session& s = *session_;
  std::vector<dist::AgreementField> fields = s.agreement_fields();
  auto num = [](double v) { return detail::cat(v); };
  auto i = [](int64_t v) { return std::to_string(v); };
  std::vector<dist::AgreementField> mine = {
      {"model shape (--gpt-config, --layers, --heads, --width, --context, --vocab, --dropout)",
       shape_json().dump()},
      {"--batch-size", i(cfg_.batch_size)},
      {"--total-batch-tokens", i(cfg_.total_batch_tokens)},
      {"--steps", i(cfg_.steps)},
      {"--stop-at", i(cfg_.stop_at)},
      {"--warmup", i(cfg_.warmup)},
      {"--min-lr", num(cfg_.min_lr_or_default())},
      {"--beta1", num(cfg_.beta1)},
      {"--beta2", num(cfg_.beta2)},
      {"--clip-norm", num(cfg_.clip_norm)},
      {"--eval-every", i(cfg_.eval_every)},
      {"--eval-steps", i(cfg_.eval_steps)},
      {"--log-every", i(cfg_.log_every)},
      {"--checkpoint-every", i(cfg_.checkpoint_every)},
      {"--check-consistency", i(cfg_.check_consistency)},
      {"--checkpoint (set or not)", cfg_.checkpoint.empty() ? "not set" : "set"},
      {"training tokens", i(train_stream_.size())},
      {"validation tokens", i(specs_.val.empty() ? 0 : val_stream_.size())},
  };
  fields.insert(fields.end(), mine.begin(), mine.end());
  dist::check_agreement(fields);
}

bool LmTrainer::resume() {
  Session& s = *session_;
  const std::string& path = cfg_.checkpoint;
  std::error_code ec;
  std::string seen = "no checkpoint";
  nlohmann::json meta;
  std::exception_ptr unreadable;
  if (fs::exists(path, ec)) {
    try {
      meta = nlohmann::json::parse(checkpoint_meta(path), nullptr, false);
      seen = meta.is_object() && meta.contains("step") && meta["step"].is_number_integer()
                 ? "the checkpoint of step " + std::to_string(meta["step"].get<int64_t>())
                 : "a checkpoint without a step";
    } catch (const Error& e) {
      seen = std::string("an unreadable checkpoint (") + e.what() + ")";
      unreadable = std::current_exception();
    }
  }
  dist::check_agreement({{"what --resume found", seen, true, fs::absolute(path, ec).string() + " on " + host_name(),
                          "Every rank must find the same --checkpoint (on a disk all nodes share, or copied to each "
                          "node before resuming)"}});
  if (seen == "no checkpoint") {
    if (s.lead()) std::fprintf(stderr, "tandem: no checkpoint at '%s' yet: starting at step 0\n", path.c_str());
    return true;
  }
  if (unreadable) std::rethrow_exception(unreadable);
  TANDEM_CHECK(meta.value("kind", std::string()) == "language model", "checkpoint '", path, "' holds ",
               meta.contains("epoch") ? "an image model's run (it counts epochs)" : "no language model's run",
               "; resume it with its own command or use another --checkpoint");
  // What the saved state cannot be carried over without.
  auto same = [&](const char* key, const std::string& now, const char* flag) {
    const std::string saved = meta.contains(key) && meta[key].is_string() ? meta[key].get<std::string>() : "?";
    TANDEM_CHECK(saved == now, "checkpoint '", path, "' was saved with ", flag, " ", saved, " and this run uses ", flag,
                 " ", now, ": resume with the same, or start a new run with another --checkpoint");
  };
  same("model", cfg_.model, "--model");
  same("optimizer", cfg_.optimizer, "--optimizer");
  same("dist_option", s.sync().method, "-d");
  const int64_t saved_context = meta_int(meta, "context", path), saved_vocab = meta_int(meta, "vocab", path);
  TANDEM_CHECK(saved_context == context_ && saved_vocab == vocab_, "checkpoint '", path, "' holds a model of ",
               "context ", saved_context, " and vocabulary ", saved_vocab, "; this run builds context ", context_,
               " and vocabulary ", vocab_, ": resume with the same --context and --vocab");
  if (meta.contains("gpt")) {
    const nn::GptConfig g = gpt_shape_from_json(meta["gpt"]);
    const std::string from = meta.contains("init") && meta["init"].is_string() ? meta["init"].get<std::string>() : "";
    TANDEM_CHECK(gpt_shape_json(g) == gpt_shape_json(shape_), "checkpoint '", path, "' holds a GPT of shape ",
                 meta["gpt"].dump(), "; this run builds ", gpt_shape_json(shape_).dump(),
                 from.empty() || !cfg_.init.empty() ? ": resume with the same --gpt-config and overrides"
                                                    : ": resume with --init " + from + ", the directory it started from");
  }
  if (meta.contains("llama")) {
    const nlohmann::json now = nlohmann::json::parse(nn::llama_config_to_json(llama_));
    TANDEM_CHECK(meta["llama"] == now, "checkpoint '", path, "' holds a Llama of shape ", meta["llama"].dump(),
                 "; this run builds ", now.dump(), ": resume with the same --llama-config and overrides (or --init)");
  }
  const int64_t step = meta_int(meta, "step", path);
  TANDEM_CHECK(step >= 0, "checkpoint '", path, "' records step ", step);
  const int64_t last = cfg_.stop_at > 0 ? cfg_.stop_at : cfg_.steps;
  if (step >= last) {
    if (s.lead())
      std::fprintf(stderr, "tandem: checkpoint '%s' holds a finished run (%lld of %s %lld steps done): nothing to train\n",
                   path.c_str(), static_cast<long long>(step), cfg_.stop_at > 0 ? "--stop-at" : "--steps",
                   static_cast<long long>(last));
    return false;
  }
  // What changes the rest of the run, said once.
  if (s.lead()) {
    auto differs = [&](const char* key, int64_t now, const char* what) {
      if (meta.contains(key) && meta[key].is_number_integer() && meta[key].get<int64_t>() != now)
        std::fprintf(stderr, "tandem: checkpoint '%s' was saved with %s %lld, resuming with %lld: %s\n", path.c_str(),
                     key, static_cast<long long>(meta[key].get<int64_t>()), static_cast<long long>(now), what);
    };
    differs("world_size", s.world(), "each rank now draws its windows from another part of the data");
    differs("batch_size", cfg_.batch_size, "the batches differ from the original run's");
    differs("accumulate", accumulate_, "the steps take another number of micro-batches");
    differs("steps", cfg_.steps, "the learning-rate schedule is stretched to the new length");
    if (meta.contains("seed") && meta["seed"].is_number_unsigned() && meta["seed"].get<uint64_t>() != cfg_.seed)
      std::fprintf(stderr, "tandem: checkpoint '%s' was saved with --seed %llu, resuming with --seed %llu: the "
                   "windows drawn differ from the original run's\n", path.c_str(),
                   static_cast<unsigned long long>(meta["seed"].get<uint64_t>()),
                   static_cast<unsigned long long>(cfg_.seed));
  }
  // The schedule is set: loading the optimizer's step count puts the learning rate where it was.
  load_checkpoint(path, s.model(), &s.opt().optimizer());

  // This rank's own state, when its file is there and from the same step.
  load_rank_state_beside(s, path, "step", step);

  // The dropout generators continue where they were (rank 0's saved; every rank draws as many).
  if (meta.contains("rng") && meta["rng"].is_object())
    for (auto& [name, gen] : s.model().named_generators())
      if (meta["rng"].contains(name) && meta["rng"][name].is_number_unsigned())
        gen->set_offset(meta["rng"][name].get<uint64_t>() + rank_counters(s.rank()));
  // The windows continue after the last one drawn.
  const int64_t windows = meta.contains("train_windows") ? meta_int(meta, "train_windows", path)
                                                         : step * accumulate_ * cfg_.batch_size;
  const int64_t batches = (windows + cfg_.batch_size - 1) / cfg_.batch_size;
  train_batches_->seek(batches);
  first_step_ = step;
  if (meta.contains("val_loss") && meta["val_loss"].is_number()) last_val_loss_ = meta["val_loss"].get<double>();
  if (s.lead()) std::fprintf(stderr, "tandem: resuming from '%s' at step %lld\n", path.c_str(), static_cast<long long>(step));
  return true;
}

StepResult LmTrainer::train_step() {
  Session& s = *session_;
  if (accumulate_ == 1) {
    // A whole step: the session may record it, with the draw of its windows, and replay it.
    return s.train_step(x_, y_, /*track=*/false, [this] { train_batches_->fill(x_, y_, pos_); });
  }
  // Micro-batches: each loss weighted by 1/N, so the step applies the mean gradient over all of them.
  step_loss_.zero_();
  const double weight = 1.0 / static_cast<double>(accumulate_);
  for (int64_t i = 0; i < accumulate_; ++i) {
    train_batches_->fill(x_, y_, pos_);
    StepResult r = s.forward_backward(x_, y_, weight, i + 1 == accumulate_);
    add_into(step_loss_, r.loss.view({1}));
  }
  StepResult out;
  out.loss = step_loss_;
  out.grad_norm = s.apply_update();
  return out;
}

double LmTrainer::evaluate() {
  Session& s = *session_;
  // partialUpdate: the ranks evaluate one model, the replicas' average; each goes on training its own.
  dist::DistOpt::AveragedReplicas averaged(s.opt());
  s.model().eval();
  Tensor loss_sum = Tensor::zeros({1}, DType::f32, s.device());
  Tensor kept_targets = Tensor::zeros({1}, DType::f32, s.device());  // with a loss mask: the targets not -100
  int64_t rows = 0;
  {
    NoGradGuard no_grad;
    PrecisionScope scope(s.precision());
    data::TokenBatches& vb = *val_batches_;
    vb.seek(0);  // the same windows at every evaluation
    const int64_t want = std::min(cfg_.eval_steps * cfg_.batch_size, vb.windows());
    Tensor x, y, pos;
    auto* lm = dynamic_cast<nn::CausalLm*>(&s.model());
    while (rows < want) {
      const int64_t n = std::min(cfg_.batch_size, want - rows);
      if (!x.defined() || x.size(0) != n) {
        x = Tensor::empty({n, context_}, DType::i32, s.device());
        y = Tensor::empty({n, context_}, DType::i32, s.device());
        if (vb.documented()) pos = Tensor::zeros({n, context_}, DType::i32, s.device());
      }
      vb.fill(x, y, pos);
      if (lm && vb.documented()) lm->set_document_positions(pos);
      if (specs_.loss_mask) {
        // The losses of the targets kept (those not -100) added up, and counted: the loss of every
        // trained-on token counts once, however they fall into batches.
        add_into(loss_sum, softmax_cross_entropy(s.model().forward(x), y, Reduction::Sum).view({1}));
        add_into(kept_targets, sum(cast(not_equal(y, -100.0), DType::f32)).view({1}));
      } else {
        Tensor loss = softmax_cross_entropy(s.model().forward(x), y, Reduction::Mean);
        add_into(loss_sum, scale(loss.view({1}), static_cast<double>(n)));
      }
      rows += n;
    }
  }
  s.model().train(true);
  if (auto* lm = dynamic_cast<nn::CausalLm*>(&s.model()); lm && val_batches_->documented())
    lm->set_document_positions(pos_);  // the training batch's again
  s.comm().all_reduce(loss_sum)->wait();
  if (specs_.loss_mask) {
    s.comm().all_reduce(kept_targets)->wait();
    const double targets = kept_targets.item<double>();
    return targets > 0 ? loss_sum.item<double>() / targets : 0.0;
  }
  Tensor count = Tensor::full({1}, static_cast<double>(rows), DType::i64, s.device());
  s.comm().all_reduce(count)->wait();
  const double total_rows = static_cast<double>(count.item<int64_t>());
  return total_rows > 0 ? loss_sum.item<double>() / total_rows : 0.0;
}

void LmTrainer::report_step(int64_t step, const StepResult& r, double seconds, int64_t steps_timed) {
  Session& s = *session_;
  // The mean over ranks (a collective: every rank takes part).
  Tensor loss = Tensor::empty({1}, DType::f32, s.device());
  loss.copy_(r.loss.view({1}));
  s.comm().all_reduce(loss)->wait();
  const double mean_loss = loss.item<double>() / s.world();
  TANDEM_RUNTIME_CHECK(std::isfinite(mean_loss), "the training loss became ", mean_loss, " at step ", step,
                       "; lower --lr (or check the data)");
  if (!s.lead()) return;
  const double step_tokens = static_cast<double>(cfg_.batch_size * context_ * accumulate_ * s.world());
  LmStepFigures f;
  f.step = step;
  f.steps = cfg_.steps;
  f.loss = mean_loss;
  // The rate the step just taken used (the optimizer has moved on to the next one's).
  f.lr = s.opt().optimizer().schedule()->lr(step - 1);
  if (r.grad_norm.defined()) f.grad_norm = r.grad_norm.item<double>();
  f.step_ms = seconds / std::max<int64_t>(steps_timed, 1) * 1e3;
  f.tokens_per_s = seconds > 0 ? step_tokens * static_cast<double>(steps_timed) / seconds : 0.0;
  f.mfu = mfu(f.tokens_per_s / s.world(), flops_per_token_, peak_);
  std::printf("%s\n", lm_step_line(f).c_str());
  std::fflush(stdout);
  const dist::CommStats& c = s.opt().stats();
  if (board_) {
    board_->scalar("train/loss", f.loss, step);
    board_->scalar("train/lr", f.lr, step);
    if (f.grad_norm >= 0) board_->scalar("train/grad_norm", f.grad_norm, step);
    board_->scalar("train/tokens_per_s", f.tokens_per_s, step);
    if (f.mfu > 0) board_->scalar("train/mfu", f.mfu, step);
    board_->flush();
  }
  if (!metrics_) return;
  nlohmann::json j{{"step", step},
                   {"steps", cfg_.steps},
                   {"loss", f.loss},
                   {"lr", f.lr},
                   {"step_ms", f.step_ms},
                   {"tokens_per_s", f.tokens_per_s},
                   {"tokens", static_cast<int64_t>(step_tokens) * step},
                   {"flops_per_token", flops_per_token_},
                   {"model", cfg_.model},
                   {"device", s.device().str()},
                   {"world_size", s.world()},
                   {"dist_option", s.sync().method},
                   {"precision", precision_name(s.precision())},
                   {"batch_size", cfg_.batch_size},
                   {"context", context_},
                   {"accumulate", accumulate_},
                   {"bytes_sent_per_step", c.bytes_sent / std::max<int64_t>(c.steps, 1)}};
  if (f.grad_norm >= 0) j["grad_norm"] = f.grad_norm;
  if (f.mfu > 0) j["mfu"] = f.mfu;
  if (c.skipped_updates > 0) j["skipped_steps"] = c.skipped_updates;
  metrics_->write(j);
}

void LmTrainer::report_eval(int64_t step, double val_loss, double seconds) {
  Session& s = *session_;
  last_val_loss_ = val_loss;
  if (!s.lead()) return;
  std::printf("step %lld/%lld | validation loss %.4f | %.1f s\n", static_cast<long long>(step),
              static_cast<long long>(cfg_.steps), val_loss, seconds);
  std::fflush(stdout);
  if (board_) {
    board_->scalar("eval/loss", val_loss, step);
    board_->flush();
  }
  if (metrics_)
    metrics_->write({{"step", step}, {"val_loss", val_loss}, {"eval_s", seconds}, {"model", cfg_.model},
                     {"world_size", s.world()}});
}

void LmTrainer::save_main_checkpoint(int64_t step) {
  Session& s = *session_;
  nlohmann::json rng = nlohmann::json::object();
  for (auto& [name, gen] : s.model().named_generators()) rng[name] = gen->offset();
  nlohmann::json meta{{"kind", "language model"},
                      {"step", step},
                      {"steps", cfg_.steps},
                      {"model", cfg_.model},
                      {"optimizer", cfg_.optimizer},
                      {"world_size", s.world()},
                      {"seed", cfg_.seed},
                      {"dist_option", s.sync().method},
                      {"shard", dist::shard_name(s.opt().options().shard)},
                      {"rank_files", s.world()},
                      {"data", specs_.train},
                      {"val_data", specs_.val},
                      {"context", context_},
                      {"vocab", vocab_},
                      {"batch_size", cfg_.batch_size},
                      {"accumulate", accumulate_},
                      {"train_windows", step * accumulate_ * cfg_.batch_size},
                      {"loss_mask", specs_.loss_mask},
                      {"tokens", step * accumulate_ * cfg_.batch_size * context_ * s.world()},
                      {"lr", cfg_.lr},
                      {"min_lr", cfg_.min_lr_or_default()},
                      {"warmup", cfg_.warmup},
                      {"rng", rng}};
  if (cfg_.model == "gpt") meta["gpt"] = gpt_shape_json(shape_);
  if (cfg_.model == "llama") meta["llama"] = nlohmann::json::parse(nn::llama_config_to_json(llama_));
  if (!hf_config_.empty()) {
    meta["hf_config"] = nlohmann::json::parse(hf_config_);
    meta["init"] = fs::absolute(cfg_.init).string();
  }
  if (last_val_loss_ >= 0.0) meta["val_loss"] = last_val_loss_;
  tandem::save_checkpoint(cfg_.checkpoint, s.model(), &s.opt().optimizer(), meta.dump());
}

void LmTrainer::save_checkpoint(int64_t step) {
  Session& s = *session_;
  if (cfg_.checkpoint.empty()) return;
  save_rank_state_beside(s, cfg_.checkpoint, "step", step);
  GatheredOptimizerState gathered(s.opt());
  // partialUpdate: the file holds the replicas' average (the model to evaluate or generate with); each rank's
  // own replica is in its state beside it, and training goes on from that.
  dist::DistOpt::AveragedReplicas averaged(s.opt());
  if (s.lead()) save_main_checkpoint(step);
}

}  // namespace tandem::cli
