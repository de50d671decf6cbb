// `tandem train`: flags and validation.
#include "cli/commands.h"
#include "cli/trainer.h"
#include "tandem/nn/models.h"

namespace tandem::cli {

Runner add_train_command(CLI::App& app) {
  auto cfg = std::make_shared<TrainConfig>();
  CLI::App* sub = app.add_subcommand("train", "Train a model and report loss and accuracy per epoch");
  // A flag given twice takes its last value, so wrappers can append overrides (./tandem.sh run --epochs 2).
  sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->footer(
      "Example (the guide's run):\n"
      "  tandem train --model cnn --dataset fashion-mnist --epochs 10 --batch-size 64 --lr 0.005 \\\n"
      "               --momentum 0.9 --weight-decay 1e-5 --device cuda\n"
      "Per epoch it prints 'Starting Epoch N:', 'Training loss = L, training accuracy = A' (L is the sum\n"
      "of the per-batch mean losses) and 'Evaluation accuracy = A, Elapsed Time = Ts'.");
  sub->add_option("--model", cfg->model, "Model: cnn (the guide's MNIST CNN), mlp, resnet18/34/50/101/152")
      ->check(CLI::IsMember(nn::model_names()))
      ->capture_default_str();
  sub->add_option("--dataset", cfg->dataset, "Data set: fashion-mnist, mnist or cifar10")
      ->check(CLI::IsMember({"fashion-mnist", "mnist", "cifar10"}))
      ->capture_default_str();
  sub->add_option("--data-dir", cfg->data_dir,
                  "Directory holding the data set's files (default: $TANDEM_DATA_DIR/<dataset> when set, else /usr/share/datasets/<dataset>)");
  sub->add_option("-m,--epochs", cfg->epochs, "Epochs to train")->check(CLI::Range(1, 1000000))->capture_default_str();
  sub->add_option("-b,--batch-size", cfg->batch_size, "Samples per micro-batch on each process")
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
                  "Scale the averaged gradients so their global L2 norm is at most X before each update (0: off)")
      ->check(finite_in(0.0, 1e30));
  sub->add_option("--optimizer", cfg->optimizer, "sgd or adam")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  sub->add_option("-l,--lr", cfg->lr, "Learning rate")->check(finite_in(0.0, 1e6))->capture_default_str();
  sub->add_option("--momentum", cfg->momentum, "SGD momentum")->check(finite_in(0.0, 1.0))->capture_default_str();
  sub->add_option("--weight-decay", cfg->weight_decay, "L2 weight decay")
      ->check(finite_in(0.0, 1.0))
      ->capture_default_str();
  sub->add_flag("--nesterov", cfg->nesterov, "Nesterov momentum (SGD)");
  sub->add_option("--device", cfg->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--seed", cfg->seed, "Seed for initialisation and shuffling")->capture_default_str();
  sub->add_option("--precision", cfg->precision,
                  "f32 (exact), tf32 (TF32 tensor cores), bf16 or f16 (mixed precision: f32 weights, 16-bit "
                  "convolutions and products); default tf32 on CUDA, f32 on the CPU")
      ->check(CLI::IsMember({"f32", "tf32", "bf16", "f16"}));
  add_cuda_graph_option(*sub, cfg->cuda_graph);
  sub->add_flag("--deterministic", cfg->deterministic,
                "GPU: only algorithms that give the same bits on every run (no atomics in convolution gradients)");
  sub->add_option("--metrics", cfg->metrics_path,
                  "Append one JSON line per epoch to this file (with the run's id and a timestamp); a regular "
                  "file, not a symbolic link");
  sub->add_option("--tensorboard", cfg->tensorboard_dir,
                  "Write TensorBoard event files (loss, accuracy, images/s, bytes moved) into this directory");
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
  sub->add_option("--hidden", cfg->hidden, "Hidden layer sizes of the mlp model (default 512 512)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--checkpoint", cfg->checkpoint,
                  "Save the model and optimizer to this file after every epoch (written atomically by rank 0)");
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
  return [cfg] { return Trainer(*cfg).run(); };
}

}  // namespace tandem::cli
