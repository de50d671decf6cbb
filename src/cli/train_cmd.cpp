// `tandem train`: flags and validation.
#include "cli/commands.h"
#include "cli/trainer.h"

namespace tandem::cli {

Runner add_train_command(CLI::App& app) {
  auto cfg = std::make_shared<TrainConfig>();
  CLI::App* sub = app.add_subcommand("train", "Train a model and report loss and accuracy per epoch");
  sub->footer(
      "Example (the guide's run):\n"
      "  tandem train --model cnn --dataset fashion-mnist --epochs 10 --batch-size 64 --lr 0.005 \\\n"
      "               --momentum 0.9 --weight-decay 1e-5 --device cuda\n"
      "Per epoch it prints 'Starting Epoch N:', 'Training loss = L, training accuracy = A' (L is the sum\n"
      "of the per-batch mean losses) and 'Evaluation accuracy = A, Elapsed Time = Ts'.");
  sub->add_option("--model", cfg->model, "Model: cnn (the guide's MNIST CNN) or mlp")
      ->check(CLI::IsMember({"cnn", "mlp"}))
      ->capture_default_str();
  sub->add_option("--dataset", cfg->dataset, "Data set: fashion-mnist, mnist or cifar10")
      ->check(CLI::IsMember({"fashion-mnist", "mnist", "cifar10"}))
      ->capture_default_str();
  sub->add_option("--data-dir", cfg->data_dir,
                  "Directory holding the data set's files (default: /usr/share/datasets/<dataset>)");
  sub->add_option("-m,--epochs", cfg->epochs, "Epochs to train")->check(CLI::Range(1, 1000000))->capture_default_str();
  sub->add_option("-b,--batch-size", cfg->batch_size, "Samples per step on each process")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub->add_option("--optimizer", cfg->optimizer, "sgd or adam")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  sub->add_option("-l,--lr", cfg->lr, "Learning rate")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  sub->add_option("--momentum", cfg->momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  sub->add_option("--weight-decay", cfg->weight_decay, "L2 weight decay")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_flag("--nesterov", cfg->nesterov, "Nesterov momentum (SGD)");
  sub->add_option("--device", cfg->device, "cpu, cuda or cuda:N")->capture_default_str();
  sub->add_option("--seed", cfg->seed, "Seed for initialisation and shuffling")->capture_default_str();
  sub->add_option("--metrics", cfg->metrics_path, "Append one JSON line per epoch to this file");
  sub->add_option("--threads", cfg->threads, "CPU threads for kernels (0: all cores)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--limit-train", cfg->limit_train, "Use only the first N training samples (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--limit-test", cfg->limit_test, "Use only the first N test samples (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub->add_option("--hidden", cfg->hidden, "Hidden layer sizes of the mlp model (default 512 512)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--progress", cfg->progress, "Progress bar on stderr: auto (when a terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  return [cfg] { return run_training(*cfg); };
}

}  // namespace tandem::cli
