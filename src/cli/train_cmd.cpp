// `tandem train`: flags and validation. Image models train by epochs (Trainer), language models by
// optimizer steps over token shards (LmTrainer); the flags of one kind are refused for the other.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/lm_trainer.h"
#include "cli/trainer.h"
#include "tandem/nn/gpt.h"
#include "tandem/nn/llama.h"
#include "tandem/nn/models.h"

namespace tandem::cli {

namespace {
// "bigram, gpt": the language models this build has.
std::string language_models() {
  std::string out;
  for (const std::string& name : nn::language_model_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}
}  // namespace

Runner add_train_command(CLI::App& app) {
  auto cfg = std::make_shared<TrainConfig>();
  auto lm = std::make_shared<LmTrainConfig>();
  const LmTrainConfig lm_defaults;
  CLI::App* sub = app.add_subcommand("train", "Train a model and report loss and accuracy per epoch");
  // A flag given twice takes its last value, so wrappers can append overrides (./tandem.sh run --epochs 2).
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->footer(
      "Example (the guide's run):\n"
      "  tandem train --model cnn --dataset fashion-mnist --epochs 10 --batch-size 64 --lr 0.005 \\\n"
      "               --momentum 0.9 --weight-decay 1e-5 --device cuda\n"
      "Per epoch it prints 'Starting Epoch N:', 'Training loss = L, training accuracy = A' (L is the sum\n"
      "of the per-batch mean losses) and 'Evaluation accuracy = A, Elapsed Time = Ts'.");
  sub->add_option("--model", cfg->model,
                  "Model: cnn (the guide's MNIST CNN), mlp, resnet18/34/50/101/152; language models (trained on "
                  "token shards, by steps): bigram (one table of next-token logits, the smallest), gpt")
      ->check(CLI::IsMember(nn::model_names()))
      ->capture_default_str();
  sub->add_option("--dataset", cfg->dataset, "Data set: fashion-mnist, mnist or cifar10")
      ->check(CLI::IsMember({"fashion-mnist", "mnist", "cifar10"}))
      ->capture_default_str();
  sub->add_option("--data-dir", cfg->data_dir,
                  "Directory holding the data set's files (default: $TANDEM_DATA_DIR/<dataset> when set, else /usr/share/datasets/<dataset>)");
  sub->add_option("-m,--epochs", cfg->epochs, "Epochs to train")->check(CLI::Range(1, 1000000))->capture_default_str();
  sub->add_option("-b,--batch-size", cfg->batch_size,
                  "Samples per micro-batch on each process (language models: sequences of --context tokens, default " +
                      std::to_string(lm_defaults.batch_size) + ")")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub->add_option("--eval-batch-size", cfg->eval_batch_size,
                  "Samples per evaluation batch on each process (default: " + std::to_string(kEvalBatchFactor) +
                      " x --batch-size; evaluation keeps no activations for a backward pass, and its accuracy does "
                      "not depend on the batch)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("--accumulate", cfg->accumulate,
                  "Micro-batches per optimizer step: gradients of N batches are added up locally and averaged "
                  "across ranks once (a step sees N x --batch-size samples per rank)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  sub->add_option("--clip-norm", cfg->clip_norm,
                  "Scale the averaged gradients so their global L2 norm is at most X before each update (0: off; "
                  "language models: default 1)")
      ->check(finite_in(0.0, 1e30));
  sub->add_option("--optimizer", cfg->optimizer,
                  "sgd, adam (L2 weight decay) or adamw (decoupled weight decay on the parameters of 2 or more "
                  "dimensions only, nanoGPT's rule); language models: default adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  sub->add_option("-l,--lr", cfg->lr,
                  "Learning rate (language models: the peak of the schedule, default 6e-4)")
      ->check(finite_in(0.0, 1e6))
      ->capture_default_str();
  sub->add_option("--momentum", cfg->momentum, "SGD momentum")->check(finite_in(0.0, 1.0))->capture_default_str();
  sub->add_option("--weight-decay", cfg->weight_decay, "Weight decay (language models: default 0.1)")
      ->check(finite_in(0.0, 1.0))
      ->capture_default_str();
  sub->add_flag("--nesterov", cfg->nesterov, "Nesterov momentum (SGD)");
  sub->add_option("--beta1", cfg->beta1, "adam, adamw: decay of the gradients' running mean")
      ->check(finite_in(0.0, 0.999999))
      ->capture_default_str();
  sub->add_option("--beta2", cfg->beta2,
                  "adam, adamw: decay of the squared gradients' running mean (language models: default 0.95)")
      ->check(finite_in(0.0, 0.999999))
      ->capture_default_str();
  sub->add_option("--device", cfg->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--seed", cfg->seed, "Seed for initialisation and shuffling")->capture_default_str();
  sub->add_option("--precision", cfg->precision,
                  "f32 (exact), tf32 (TF32 tensor cores), bf16 or f16 (mixed precision: f32 weights, 16-bit "
                  "convolutions and products); default tf32 on CUDA (language models: bf16), f32 on the CPU")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  add_cuda_graph_option(*sub, cfg->cuda_graph);
  sub->add_flag("--deterministic", cfg->deterministic,
                "GPU: only algorithms that give the same bits on every run (no atomics in convolution gradients)");
  sub->add_option("--metrics", cfg->metrics_path,
                  "Append one JSON line per epoch (language models: per --log-every steps and per evaluation) to "
                  "this file (with the run's id and a timestamp); a regular file, not a symbolic link");
  sub->add_option("--tensorboard", cfg->tensorboard_dir,
                  "Write TensorBoard event files (loss, accuracy, images/s, bytes moved; language models: loss, "
                  "learning rate, gradient norm, tokens/s, MFU, validation loss) into this directory");
  sub->add_option("--tensorboard-every", cfg->tensorboard_every, "Steps between step-level TensorBoard points")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  sub->add_option("--threads", cfg->threads, "CPU threads for kernels (0: all cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--limit-train", cfg->limit_train, "Use only the first N training samples (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--limit-test", cfg->limit_test, "Use only the first N test samples (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--hidden", cfg->hidden, "Hidden layer sizes of the mlp model (default 512 512; refused with other "
                  "models)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--checkpoint", cfg->checkpoint,
                  "Save the model and optimizer to this file after every epoch (language models: at the end and "
                  "every --checkpoint-every steps; written atomically by rank 0). Ctrl-C or SIGTERM saves it at the "
                  "next step boundary (every rank at the same one) and exits 130 (143); a second Ctrl-C stops at "
                  "once");
  sub->add_flag("--resume", cfg->resume,
                "Continue from --checkpoint when the file exists (every rank must be able to read it)")
      ->needs("--checkpoint");
  sub->add_option("--progress", cfg->progress, "Progress bar on stderr: auto (when a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  sub->add_option("--data-on-device", cfg->data_on_device,
                  "Keep the data set on the device and gather each batch there (one kernel) instead of converting it "
                  "on the host and uploading it: auto (on a GPU, for data sets up to 2 GiB), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  const char* lmg = "Language models (--model bigram, gpt or llama)";
  std::vector<CLI::Option*> lm_only;
  auto lm_opt = [&](CLI::Option* o) {
    o->group(lmg);
    lm_only.push_back(o);
    return o;
  };
  lm_opt(sub->add_option("--data", lm->data_dir,
                         "Directory of token shards: its *train*.bin files train, its *val*.bin files validate "
                         "(what `tandem data text` writes; llm.c's and nanoGPT's shards too). One from `tandem data "
                         "jsonl` (\"loss_mask\" in its meta.json) trains at its context on its whole windows, the "
                         "loss taken on the tokens its masks mark (the responses) only"));
  lm_opt(sub->add_option("--train-data", lm->train_data,
                         "Training shards: a file, a directory of *.bin files or a glob pattern (instead of --data). "
                         "A directory holding both splits (train.bin and val.bin, *_train*.bin and *_val*.bin) trains "
                         "on its training shards only and validates on the others unless --val-data is given. A file "
                         "that is not a token shard (a text file) is refused: `tandem data text` makes shards"));
  lm_opt(sub->add_option("--val-data", lm->val_data,
                         "Validation shards, as --train-data (none: no validation, unless --train-data's directory "
                         "holds them)"));
  lm_opt(sub->add_option("--gpt-config", lm->gpt_config,
                         "gpt: the shape, gpt2 (124M), gpt2-medium (350M) or char (6 layers of 384, context 256, "
                         "bytes)")
             ->check(CLI::IsMember(nn::gpt_config_names()))
             ->capture_default_str());
  lm_opt(sub->add_option("--llama-config", lm->llama_config,
                         "llama: the shape, llama-1b (Llama 3.2 1B), llama-3b (3.2 3B) or llama-8b (3.1 8B), at "
                         "context 2048")
             ->check(CLI::IsMember(nn::llama_config_names()))
             ->capture_default_str());
  lm_opt(sub->add_option("--layers", lm->layers, "gpt, llama: transformer blocks (default: the configuration's)")
             ->check(CLI::Range(int64_t{1}, int64_t{4096})));
  lm_opt(sub->add_option("--heads", lm->heads, "gpt, llama: attention heads (default: the configuration's)")
             ->check(CLI::Range(int64_t{1}, int64_t{4096})));
  lm_opt(sub->add_option("--kv-heads", lm->kv_heads,
                         "llama: key-value heads, a divisor of --heads (grouped-query attention; default: the "
                         "configuration's)")
             ->check(CLI::Range(int64_t{1}, int64_t{4096})));
  lm_opt(sub->add_option("--width", lm->width,
                         "gpt, llama: the embedding width, a multiple of --heads (default: the configuration's)")
             ->check(CLI::Range(int64_t{1}, int64_t{1} << 20)));
  lm_opt(sub->add_option("--mlp-hidden", lm->mlp_hidden, "llama: the SwiGLU MLP's hidden width (default: the "
                         "configuration's)")
             ->check(CLI::Range(int64_t{1}, int64_t{1} << 22)));
  lm_opt(sub->add_option("--rope-theta", lm->rope_theta, "llama: the rotary embeddings' base (default: the "
                         "configuration's)")
             ->check(finite_in(1.0, 1e12)));
  lm_opt(sub->add_flag("--untied", lm->untied, "llama: an output layer of its own instead of the token table"));
  // Language models' and ResNets' alike: not in lm_only.
  sub->add_option("--recompute", lm->recompute,
                  "gpt, llama, resnet*: activation recompute. none (the default) keeps every activation for backward; "
                  "selective (gpt, llama) frees each transformer block's norm outputs (and llama's SwiGLU output) and "
                  "makes them again in backward (a few elementwise passes); full keeps only each block's input and "
                  "runs the block again there (about a third more compute, one block's activations at a time; a "
                  "ResNet's residual blocks, batch norm's running statistics moved once). The same gradients either "
                  "way, dropout's masks replayed")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  lm_opt(sub->add_flag("--no-memory-check", [cfg](int64_t) { cfg->memory_check = false; },
                       "gpt, llama: train even when the memory plan printed at start says a step does not fit the "
                       "device (its free memory; the CPU: the host's available memory, shared by its ranks; "
                       "TANDEM_MEMORY_LIMIT_MIB=N plans for N MiB instead); see docs/memory.md"));
  lm_opt(sub->add_option("--dropout", lm->dropout, "gpt, llama: dropout in training (default: the configuration's)")
             ->check(finite_in(0.0, 0.999)));
  lm_opt(sub->add_option("--init", lm->init,
                         "gpt, llama: start from the weights of a Hugging Face model directory (config.json and "
                         "model.safetensors: its config gives the shape, so --llama-config / --gpt-config and the "
                         "shape flags are refused; with --resume the run in --checkpoint continues when there is "
                         "one) or of a tandem checkpoint (the shape flags must build its model; its optimizer state "
                         "and step are not taken: --resume continues a run)"));
  lm_opt(sub->add_option("--context", lm->context,
                         "Tokens per sequence, T (default: the model's: --gpt-config's, 256 for bigram; for --data "
                         "from `tandem data jsonl`, the data's, which another value may not differ from)")
             ->check(CLI::Range(int64_t{1}, int64_t{1} << 20)));
  lm_opt(sub->add_option("--vocab", lm->vocab,
                         "Vocabulary size (default: the vocab_size of --data DIR's meta.json, 256 for the byte "
                         "tokens of `tandem data text`; else gpt, the configuration's; bigram, 256 or the largest "
                         "token + 1); every token of the data must be below it")
             ->check(CLI::Range(int64_t{2}, int64_t{1} << 24)));
  lm_opt(sub->add_option("--total-batch-tokens", lm->total_batch_tokens,
                         "Tokens per optimizer step over all ranks, reached by accumulating micro-batches: a multiple "
                         "of --batch-size x --context x ranks (0: one micro-batch per step)")
             ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
             ->capture_default_str());
  lm_opt(sub->add_option("--steps", lm->steps, "Optimizer steps to train (the schedule's length)")
             ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
             ->capture_default_str());
  lm_opt(sub->add_option("--stop-at", lm->stop_at,
                         "End this run after step N, saving --checkpoint, as if stopped there (the schedule still "
                         "spans --steps; --resume goes on)")
             ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
             ->needs("--checkpoint"));
  lm_opt(sub->add_option("--warmup", lm->warmup,
                         "Steps of linear warm-up to --lr, then cosine decay to --min-lr at --steps")
             ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
             ->capture_default_str());
  lm_opt(sub->add_option("--min-lr", lm->min_lr, "The learning rate the cosine decay ends at (default: --lr / 10)")
             ->check(finite_in(0.0, 1e6)));
  lm_opt(sub->add_option("--eval-every", lm->eval_every,
                         "Every N steps (from step 0), the validation loss over --eval-steps batches; it is also "
                         "taken at the end (0: at the end only)")
             ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
             ->capture_default_str());
  lm_opt(sub->add_option("--eval-steps", lm->eval_steps,
                         "Validation batches of --batch-size sequences per rank in each evaluation (the same windows "
                         "every time; 0: no validation)")
             ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
             ->capture_default_str());
  lm_opt(sub->add_option("--log-every", lm->log_every,
                         "Steps between step lines (loss, lr, norm, ms, tok/s, MFU), metrics lines and TensorBoard "
                         "points")
             ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
             ->capture_default_str());
  lm_opt(sub->add_option("--checkpoint-every", lm->checkpoint_every,
                         "Also save --checkpoint every N steps (0: at the end only)")
             ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
             ->needs("--checkpoint"));
  const char* dist = "Distributed (under tandem launch, mpiexec or torchrun)";
  add_sync_options(*sub, *cfg, dist);
  sub->add_option("--check-consistency", cfg->check_consistency,
                  "Every N steps (and after each epoch), verify all ranks hold bit-identical parameters (0: off)")
      ->group(dist)
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_flag("--report-comm", cfg->report_comm, "Print bytes sent/received per step and time spent waiting")
      ->group(dist);
  sub->add_option("--timeout", cfg->timeout_s, "Seconds before a collective that does not complete fails")
      ->group(dist)
      ->check(finite_in(1.0, 1e6))
      ->capture_default_str();
  sub->footer(sub->get_footer() +
              "\n\nDistributed: start with `tandem launch -n N -- tandem train ...` or `mpiexec --hostfile FILE tandem\n"
              "train ...`. Each rank trains on its own 1/N of the data with --batch-size samples per step, so the\n"
              "global batch is N x --batch-size. --lr is used as given: scaling it with N is your choice.");
  sub->footer(sub->get_footer() +
              "\n\nLanguage models (--model bigram, gpt) train on token shards by optimizer steps:\n"
              "  tandem train --model gpt --gpt-config char --data build/data/shakespeare --batch-size 64 \\\n"
              "               --steps 5000 --lr 1e-3 --warmup 100 --min-lr 1e-4 --eval-every 250 --device cuda\n"
              "They print 'step S/N | loss L | lr R | norm G | T ms | K tok/s | MFU M%' lines and the validation\n"
              "loss; AdamW (0.9, 0.95), weight decay 0.1 on matrices and embeddings, --clip-norm 1, bf16 on GPUs.");
  // The flags of image training that mean nothing to a language model.
  const std::vector<std::string> image_only = {"--dataset",   "--data-dir",       "--epochs",
                                               "--eval-batch-size", "--accumulate", "--limit-train",
                                               "--limit-test", "--hidden",        "--progress",
                                               "--data-on-device", "--tensorboard-every"};
  return [sub, cfg, lm, lm_only, image_only] {
    auto given = [sub](const std::string& name) { return sub->get_option(name)->count() > 0; };
    if (!nn::is_language_model(cfg->model)) {
      for (CLI::Option* o : lm_only)
        TANDEM_CHECK(o->count() == 0, o->get_name(), " is for language models (--model ", language_models(),
                     "); --model ", cfg->model, " trains on --dataset by epochs");
      check_flags_apply(*sub, cfg->model, cfg->optimizer, cfg->dist_option);
      cfg->recompute = lm->recompute;
      return Trainer(*cfg).run();
    }
    for (const std::string& name : image_only) {
      const char* instead = name == "--epochs"       ? ": language models train for --steps optimizer steps"
                            : name == "--accumulate" ? ": language models accumulate to --total-batch-tokens"
                            : name == "--dataset" || name == "--data-dir"
                                ? ": language models read token shards from --data DIR (or --train-data, --val-data)"
                            : name == "--progress" || name == "--tensorboard-every"
                                ? ": language models report every --log-every steps"
                                : "";
      TANDEM_CHECK(!given(name), name, " is for image models; --model ", cfg->model, " is a language model", instead);
    }
    LmTrainConfig c = *lm;
    const LmTrainConfig d;
    static_cast<SessionConfig&>(c) = static_cast<const SessionConfig&>(*cfg);
    // Where a language model's default differs from the image models', an unset flag takes it.
    if (!given("--optimizer")) c.optimizer = d.optimizer;
    if (!given("--lr")) c.lr = d.lr;
    if (!given("--weight-decay")) c.weight_decay = d.weight_decay;
    if (!given("--clip-norm")) c.clip_norm = d.clip_norm;
    if (!given("--beta1")) c.beta1 = d.beta1;
    if (!given("--beta2")) c.beta2 = d.beta2;
    c.batch_size = given("--batch-size") ? cfg->batch_size : d.batch_size;
    c.metrics_path = cfg->metrics_path;
    c.tensorboard_dir = cfg->tensorboard_dir;
    c.checkpoint = cfg->checkpoint;
    c.resume = cfg->resume;
    c.check_consistency = cfg->check_consistency;
    c.report_comm = cfg->report_comm;
    check_flags_apply(*sub, c.model, c.optimizer, c.dist_option);
    if (c.model == "bigram")
      for (const char* name : {"--gpt-config", "--llama-config", "--layers", "--heads", "--kv-heads", "--width",
                               "--mlp-hidden", "--rope-theta", "--untied", "--dropout", "--init", "--recompute"})
        TANDEM_CHECK(!given(name), name, " shapes --model gpt or llama; bigram is one vocab x vocab table (it takes ",
                     "--vocab and --context)");
    if (c.model == "gpt")
      for (const char* name : {"--llama-config", "--kv-heads", "--mlp-hidden", "--rope-theta", "--untied"})
        TANDEM_CHECK(!given(name), name, " shapes --model llama; --model gpt takes --gpt-config, --layers, --heads, ",
                     "--width");
    if (c.model == "llama")
      TANDEM_CHECK(!given("--gpt-config"), "--gpt-config shapes --model gpt; --model llama takes --llama-config");
    if (!c.init.empty() && std::filesystem::is_directory(c.init))
      for (const char* name : {"--gpt-config", "--llama-config", "--layers", "--heads", "--kv-heads", "--width",
                               "--mlp-hidden", "--rope-theta", "--untied", "--vocab"})
        TANDEM_CHECK(!given(name), name, " would change the shape of the model --init '", c.init, "' holds (its ",
                     "config.json gives it): leave it out");
    // A directory's config.json gives the shape (which the flags may not express: a padded GPT-2 table), so a run
    // started from it resumes with it; a checkpoint's weights are the start of a new run only.
    TANDEM_CHECK(c.init.empty() || !c.resume || std::filesystem::is_directory(c.init),
                 "--init FILE starts a new run from a checkpoint's weights; --resume continues the run in ",
                 "--checkpoint: give one or the other");
    TANDEM_CHECK(c.warmup < c.steps, "--warmup ", c.warmup, " must be below --steps ", c.steps,
                 " (the cosine decay follows the warm-up)");
    TANDEM_CHECK(c.min_lr_or_default() <= c.lr, "--min-lr ", c.min_lr_or_default(), " is above --lr ", c.lr,
                 ": the schedule decays from --lr to --min-lr");
    TANDEM_CHECK(c.stop_at <= c.steps, "--stop-at ", c.stop_at, " is beyond --steps ", c.steps);
    return LmTrainer(c).run();
  };
}

}  // namespace tandem::cli
