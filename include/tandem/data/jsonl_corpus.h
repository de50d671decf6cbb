#pragma once
// Instruction data for fine-tuning: JSONL files of prompt/response pairs or chat conversations,
// tokenized with a tokenizer.json into token shards with a loss mask beside each (what `tandem data
// jsonl` does). The mask marks the tokens a model is trained to predict: a response and the end token
// after it, never the prompt.
//
// Each example lies in one window of context + 1 tokens (a frame), so that no example is cut in two:
// padded, one example per window (the default), or packed, as many whole examples as fit. tandem train
// --data DIR draws its windows at frames only and sets the targets of tokens masked 0 to -100, which the
// losses leave out.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

/// How a chat message is rendered: the text before its content and the text after it; "{role}" in
/// either stands for the message's role.
struct ChatTemplate {
  std::string before, after;
};

/// The template used when neither --template nor a tokenizer_config.json's chat_template gives one.
inline constexpr const char* kDefaultChatTemplate = "<|{role}|>\n{content}\n";

/// A template text with exactly one {content} and any number of {role}, split at {content}. Throws
/// tandem::Error (Input), naming `what` (where the text came from), when {content} is missing or
/// appears more than once.
ChatTemplate parse_chat_template(std::string_view text, const std::string& what);

/// A Hugging Face chat_template (Jinja) as a ChatTemplate, when it has the one plain form tandem reads:
///   [{{ bos_token }}]{% for message in messages %}BODY{% endfor %}[{% if add_generation_prompt %}...{% endif %}]
/// where BODY is text and {{ EXPR }} tags, each EXPR string literals, message['role'] and
/// message['content'] (or message.role, message["content"]) joined by +, the content exactly once.
/// Anything else (another tag, a filter, a condition in the loop) gives nullopt and says in `why` what
/// tandem could not read. Jinja templates are programs: tandem does not run them.
std::optional<ChatTemplate> plain_chat_template(std::string_view jinja, std::string* why = nullptr);

struct JsonlCorpusOptions {
  std::vector<std::string> files;  // JSONL files, read in the order given
  std::string out_dir;             // created when missing
  std::string tokenizer;           // a Hugging Face tokenizer.json (required)
  double val_fraction = 0.1;       // the last fraction of the examples validates; in [0, 1)
  int64_t context = 1024;          // T: each window holds context + 1 tokens
  bool pack = false;               // several whole examples per window instead of one, padded
  bool skip_long = false;          // leave out examples longer than a window instead of refusing them
  /// The chat template's text ("{role}" and one "{content}"); empty: the chat_template of the
  /// tokenizer_config.json beside the tokenizer when it is plain (plain_chat_template), an error when
  /// it is not, and kDefaultChatTemplate when there is none. Used by chat lines only.
  std::string chat_template;
  std::string template_from = "--template";  // what chat_template came from, for messages
  /// The token before each example: empty, the tokenizer_config.json's bos_token, else
  /// <|begin_of_text|> when the tokenizer has it, else none; "none": none.
  std::string bos_token;
  /// The token after each response (trained on; also the padding): empty, the tokenizer_config.json's
  /// eos_token, else the first of <|eot_id|>, <|end_of_text|>, <|endoftext|> the tokenizer has.
  std::string eos_token;
  int64_t shard_tokens = 100'000'000;  // most tokens per shard file (rounded down to whole windows)
  int threads = 0;                     // threads that encode (0: every core)
  /// Called with one line of progress at a time, when set.
  std::function<void(const std::string&)> progress;
};

/// What one split got.
struct JsonlSplitReport {
  int64_t examples = 0;  // examples in it
  int64_t windows = 0;   // windows of context + 1 tokens
  int64_t tokens = 0;    // windows x (context + 1), padding included
  int64_t trained = 0;   // tokens marked 1 in the mask
  std::vector<std::string> shards;  // paths of the .bin files written
};

struct JsonlCorpusReport {
  int64_t examples = 0;         // examples read (lines that are not blank)
  int64_t prompt_response = 0;  // of them, {"prompt", "response"} lines
  int64_t chat = 0;             // of them, {"messages"} lines
  int64_t skipped_long = 0;     // left out by skip_long
  int64_t longest = 0;          // tokens of the longest example kept
  JsonlSplitReport train, val;
  int64_t vocab_size = 0;
  int token_bytes = 2;  // 2 or 4
  int64_t context = 0, window = 0;
  std::string bos_token, eos_token;  // bos_token empty: none
  int64_t bos_id = -1, eos_id = -1;
  std::string template_from;  // where the chat template came from; empty when no line is a chat
  ChatTemplate chat_template;
  std::vector<std::string> removed;  // older shards of this directory removed
  std::string meta_path;
};

/// Reads the JSONL files (each non-blank line one example: {"prompt": "...", "response": "..."} or
/// {"messages": [{"role": "...", "content": "..."}, ...]}), tokenizes them on every core, and writes
/// DIR/train_NNNNNN.{bin,mask,examples} and DIR/val_NNNNNN.{bin,mask,examples}, then DIR/meta.json
/// ("loss_mask": true) last. Every line is read and checked before anything is written. Throws
/// tandem::Error (Input) naming the file and line for a line that is not JSON, lacks its fields, has
/// an empty response (or assistant message) or no assistant message, or is longer than a window
/// (unless skip_long); and for an unreadable file, a tokenizer or template tandem cannot read, a
/// split left without examples, or an output directory that cannot be written.
JsonlCorpusReport write_jsonl_corpus(const JsonlCorpusOptions& opt);

}  // namespace tandem::data
