// The gradient codecs by name (matched ignoring case, '-' and '_'). Adding one: its file in codecs/,
// its factory's declaration and one entry below.
#include "distributed/engine/grad_codec.h"

namespace tandem::dist::detail {

std::unique_ptr<GradCodec> make_plain_codec(const CodecEnv& env, const SyncOptions& o);
std::unique_ptr<GradCodec> make_half_codec(const CodecEnv& env, const SyncOptions& o);
std::unique_ptr<GradCodec> make_top_k_codec(const CodecEnv& env, const SyncOptions& o);
std::unique_ptr<GradCodec> make_threshold_codec(const CodecEnv& env, const SyncOptions& o);
std::unique_ptr<GradCodec> make_power_sgd_codec(const CodecEnv& env, const SyncOptions& o);

namespace {

using Factory = std::unique_ptr<GradCodec> (*)(const CodecEnv&, const SyncOptions&);

struct Entry {
  CodecName name;
  Factory make;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {{"plain", {}}, make_plain_codec},
      {{"half", {"fp16", "f16"}}, make_half_codec},
      {{"sparseTopK", {"topk"}}, make_top_k_codec},
      {{"sparseThreshold", {"threshold"}}, make_threshold_codec},
      {{"powerSGD", {}}, make_power_sgd_codec},
  };
  return entries;
}

}  // namespace

const std::vector<CodecName>& codec_names() {
  static const std::vector<CodecName> names = [] {
    std::vector<CodecName> out;
    for (const Entry& e : registry()) out.push_back(e.name);
    return out;
  }();
  return names;
}

std::unique_ptr<GradCodec> make_codec(const CodecEnv& env, const SyncOptions& opts) {
  for (const Entry& e : registry()) {
    if (opts.method != e.name.name) continue;
    std::unique_ptr<GradCodec> codec = e.make(env, opts);
    // Sharding needs each rank to receive only the average of its own block; codecs whose exchange
    // gives every rank the whole bucket (sparse pairs, low-rank factors), and keep residuals of the
    // whole gradient, would hold what sharding frees.
    TANDEM_CHECK(env.shard == Shard::none || codec->shards(), "-d ", opts.method, " cannot be combined with --shard ",
                 shard_name(env.shard), ": sharded state reduce-scatters each bucket, which only -d plain and -d half "
                 "do (use one of them, or --shard none)");
    return codec;
  }
  TANDEM_CHECK(false, "no gradient codec named '", opts.method, "'");
}

}  // namespace tandem::dist::detail
