// The tokenizer: a tokenizer.json read into its stages, and text taken through them, in parallel
// where a long text can be cut.
#include "tandem/data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/regular_file.h"
#include "data/tokenizer/added_tokens.h"
#include "data/tokenizer/stages.h"
#include "data/tokenizer/unicode.h"
#include "tandem/error.h"

namespace tandem::data {

using namespace tok;

struct Tokenizer::Impl {
  std::string path;
  std::unique_ptr<Normalizer> normalizer;  // null: none
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;
  AddedTokens added;
  std::string pre_tokenizer_name;

  // One piece of text through the normalizer, pre-tokenizer and model; `continues`: the piece is a
  // chunk cut from the text after the piece's start.
  void encode_text(std::string_view text, bool continues, std::vector<uint32_t>& out, Model::Cache& cache) const {
    Words w;
    w.text.assign(text);
    if (normalizer) normalizer->normalize(w.text);
    if (w.text.empty()) return;
    w.spans.emplace_back(0, w.text.size());
    w.continues = continues;
    pre_tokenizer->apply(w);
    for (size_t i = 0; i < w.spans.size(); ++i) model->tokenize(w.word(i), out, cache);
  }

  // A unit of work: an added token, or a chunk of text.
  struct Chunk {
    size_t text = 0;  // which text of the batch
    size_t begin = 0, end = 0;
    int64_t id = -1;
    bool continues = false;
  };

  // Cuts valid text into chunks: added tokens, and the text between them cut where the pre-tokenizer
  // allows, at about `target` bytes each.
  void chunks(std::string_view text, size_t which, size_t target, std::vector<Chunk>& out) const {
    for (const Segment& s : added.split(text)) {
      if (s.id >= 0) {
        out.push_back({which, s.begin, s.end, s.id, false});
        continue;
      }
      size_t b = s.begin;
      bool continues = false;
      const std::string_view piece = text.substr(0, s.end);
      while (s.end - b > 2 * target && !normalizer) {
        size_t p = b + target;
        while (p < s.end && (static_cast<unsigned char>(piece[p]) & 0xC0) == 0x80) ++p;
        // The first allowed cut after p; a piece without one stays whole.
        size_t len;
        while (p < s.end && !pre_tokenizer->can_cut(piece.substr(b), p - b)) {
          decode_utf8(piece, p, len);
          p += len;
        }
        if (p >= s.end) break;
        out.push_back({which, b, p, -1, continues});
        b = p;
        continues = true;
      }
      out.push_back({which, b, s.end, -1, continues});
    }
  }
};

namespace {

// Text as the library would be given it: ill-formed UTF-8 replaced (a copy only when needed).
std::string_view valid(std::string_view text, std::string& storage) {
  if (valid_utf8_prefix(text) == text.size()) return text;
  storage = to_valid_utf8(text);
  return storage;
}

std::string read_file(const std::string& path) {
  uint64_t size = 0;
  std::FILE* f = io::open_regular_file(path, "tokenizer file", size);
  std::string text(static_cast<size_t>(size), '\0');
  const size_t got = size ? std::fread(text.data(), 1, text.size(), f) : 0;
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  TANDEM_CHECK(!failed, "cannot read tokenizer file '", path, "': ", std::strerror(err));
  text.resize(got);
  return text;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) { return from_json(read_file(path), path); }

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& name) {
  const Where top{name, ""};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() reads "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    std::string what = e.what();
    const size_t at = what.find("] ");
    TANDEM_CHECK(false, "tokenizer file '", name, "' is not valid JSON: ",
                 at == std::string::npos ? what : what.substr(at + 2));
  }
  TANDEM_CHECK(j.is_object(), top.str(), "expected a JSON object (a tokenizer.json), got ", j.type_name());
  TANDEM_CHECK(j.contains("model"), top.str(), "there is no \"model\": is this a tokenizer.json of Hugging Face's "
               "tokenizers library?");
  if (j.contains("version") && !j["version"].is_null()) {
    const nlohmann::json& v = j["version"];
    TANDEM_CHECK(v.is_string() && v.get<std::string>() == "1.0", top.at("version").str(), "version ", v.dump(),
                 " is not one tandem reads (it reads \"1.0\")");
  }
  TANDEM_CHECK(!j.contains("truncation") || j["truncation"].is_null(), top.at("truncation").str(),
               "the file truncates encodings (", j["truncation"].dump(),
               "), which tandem does not do: set \"truncation\" to null");
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  auto get = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json null;
    return j.contains(key) ? j[key] : null;
  };
  impl->normalizer = make_normalizer(get("normalizer"), top.at("normalizer"));
  impl->pre_tokenizer = make_pre_tokenizer(get("pre_tokenizer"), top.at("pre_tokenizer"));
  impl->model = make_model(j["model"], top.at("model"));
  impl->decoder = make_decoder(get("decoder"), top.at("decoder"));
  impl->added = AddedTokens(get("added_tokens"), *impl->model, top.at("added_tokens"));
  const nlohmann::json& pt = get("pre_tokenizer");
  impl->pre_tokenizer_name = pt.is_null() ? "no" : pt["type"].get<std::string>();
  if (pt.is_object() && pt["type"] == "Sequence") {
    impl->pre_tokenizer_name = "Sequence[";
    for (size_t i = 0; i < pt["pretokenizers"].size(); ++i)
      impl->pre_tokenizer_name += (i ? ", " : "") + pt["pretokenizers"][i]["type"].get<std::string>();
    impl->pre_tokenizer_name += "]";
  }
  return Tokenizer(std::move(impl));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) const {
  std::string storage;
  const std::string_view t = valid(text, storage);
  std::vector<uint32_t> out;
  out.reserve(t.size() / 3 + 1);
  Model::Cache cache;
  for (const Segment& s : impl_->added.split(t)) {
    if (s.id >= 0) out.push_back(static_cast<uint32_t>(s.id));
    else impl_->encode_text(t.substr(s.begin, s.end - s.begin), false, out, cache);
  }
  return out;
}

std::vector<std::vector<uint32_t>> Tokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                           int threads) const {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> storage(texts.size());
  std::vector<std::string_view> valid_texts(texts.size());
  size_t total = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    valid_texts[i] = valid(texts[i], storage[i]);
    total += valid_texts[i].size();
  }
  // Chunks of about 1 MiB, smaller when that would leave threads idle.
  const size_t target = std::clamp<size_t>(total / (8 * static_cast<size_t>(threads)) + 1, 4096, size_t{1} << 20);
  std::vector<Impl::Chunk> work;
  for (size_t i = 0; i < valid_texts.size(); ++i) impl_->chunks(valid_texts[i], i, target, work);

  std::vector<std::vector<uint32_t>> pieces(work.size());
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    Model::Cache cache;
    try {
      for (size_t k = next++; k < work.size(); k = next++) {
        const Impl::Chunk& c = work[k];
        if (c.id >= 0) pieces[k].push_back(static_cast<uint32_t>(c.id));
        else impl_->encode_text(valid_texts[c.text].substr(c.begin, c.end - c.begin), c.continues, pieces[k], cache);
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = work.size();
    }
  };
  const size_t n = std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(work.size(), 1));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);

  std::vector<std::vector<uint32_t>> out(texts.size());
  std::vector<size_t> sizes(texts.size(), 0);
  for (size_t k = 0; k < work.size(); ++k) sizes[work[k].text] += pieces[k].size();
  for (size_t i = 0; i < out.size(); ++i) out[i].reserve(sizes[i]);
  for (size_t k = 0; k < work.size(); ++k) {
    auto& o = out[work[k].text];
    o.insert(o.end(), pieces[k].begin(), pieces[k].end());
    std::vector<uint32_t>().swap(pieces[k]);
  }
  return out;
}

std::string Tokenizer::decode_bytes(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::vector<const std::string*> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (const AddedToken* a = impl_->added.find(id)) {
      if (!(skip_special_tokens && a->special)) tokens.push_back(&a->content);
      continue;
    }
    const std::string* t = impl_->model->token(id);
    TANDEM_CHECK(t, "decode: id ", id, " (position ", i, ") is no token of '", impl_->path, "' (", vocab_size(),
                 " ids)");
    if (!(skip_special_tokens && impl_->added.find(*t) && impl_->added.find(*t)->special)) tokens.push_back(t);
  }
  std::string out;
  impl_->decoder->decode(tokens, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::string bytes = decode_bytes(ids, skip_special_tokens);
  if (valid_utf8_prefix(bytes) == bytes.size()) return bytes;
  return to_valid_utf8(bytes);
}

int64_t Tokenizer::vocab_size() const { return std::max(impl_->model->id_bound(), impl_->added.id_bound()); }

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* a = impl_->added.find(token)) return a->id;
  const int64_t id = impl_->model->id(token);
  if (id < 0) return std::nullopt;
  return static_cast<uint32_t>(id);
}

std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  if (const AddedToken* a = impl_->added.find(id)) return a->content;
  if (const std::string* t = impl_->model->token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_special(uint32_t id) const {
  const AddedToken* a = impl_->added.find(id);
  return a && a->special;
}

std::optional<uint32_t> Tokenizer::document_token() const {
  for (const char* name : {"<|endoftext|>", "<|begin_of_text|>"})
    if (const AddedToken* a = impl_->added.find(std::string_view(name))) return a->id;
  return std::nullopt;
}

std::string Tokenizer::describe() const {
  return detail::cat("BPE, ", vocab_size(), " tokens (", impl_->added.tokens().size(), " added), ",
                     impl_->pre_tokenizer_name, " pre-tokenizer");
}

const std::string& Tokenizer::path() const { return impl_->path; }

}  // namespace tandem::data
