// Instruction data made into masked token shards (write_jsonl_corpus): the tokens are the tokenizer's
// encoding of each piece (bos, prompt, response, eos; chat messages through the template), the mask is 0
// on prompts, template text and padding and 1 on responses and their end token, examples never cross a
// window (padded or packed), the split, chat templates (plain Jinja read, anything else refused), and
// the errors that name a file and line.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/data_test_util.h"
#include "tandem/data/jsonl_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/data/tokens.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;
using testutil::expect_input_error;
using testutil::TempDir;

std::string fixture(const std::string& name) {
  return std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// A tokenizer fixture copied into dir as tokenizer.json (so that a tokenizer_config.json can go beside it).
std::string tokenizer_in(const TempDir& dir, const std::string& name) {
  const std::string to = dir.file("tokenizer.json");
  fs::copy_file(fixture(name), to, fs::copy_options::overwrite_existing);
  return to;
}

JsonlCorpusOptions options(const TempDir& dir, const std::string& tokenizer, const std::vector<std::string>& files) {
  JsonlCorpusOptions o;
  o.files = files;
  o.out_dir = dir.file("out");
  o.tokenizer = tokenizer;
  o.val_fraction = 0.0;
  o.context = 63;
  o.threads = 2;
  return o;
}

std::vector<uint32_t> stream_tokens(const TokenStream& s) {
  std::vector<uint32_t> t(static_cast<size_t>(s.size()));
  s.copy(0, s.size(), t.data());
  return t;
}

std::vector<uint8_t> stream_mask(const TokenStream& s) {
  std::vector<uint8_t> m;
  for (int64_t i = 0; i < s.size(); ++i) m.push_back(s.mask_at(i));
  return m;
}

std::vector<int64_t> examples_of(const std::string& path) {
  const testutil::Bytes b = testutil::read_file(path);
  std::vector<int64_t> v(b.size() / 8);
  std::memcpy(v.data(), b.data(), v.size() * 8);
  return v;
}

// Appends ids with one mask value to tokens and mask.
void put(std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask, const std::vector<uint32_t>& ids, uint8_t m) {
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  mask.insert(mask.end(), ids.size(), m);
}

TEST(DataJsonl, PromptResponseTokensAreTheEncodingAndOnlyTheResponseIsTrained) {
  TempDir dir;
  const std::string tok_path = tokenizer_in(dir, "gpt2.json");  // no <|begin_of_text|>: no bos
  write_text(dir.file("a.jsonl"),
             "{\"prompt\": \"What is the capital of France?\", \"response\": \" Paris.\"}\n"
             "\n"
             "{\"id\": 7, \"prompt\": \"Hello, world!\", \"response\": \" Hi there, how are you?\"}\r\n");
  const JsonlCorpusReport r = write_jsonl_corpus(options(dir, tok_path, {dir.file("a.jsonl")}));
  const Tokenizer tok = Tokenizer::from_file(tok_path);
  const uint32_t eos = *tok.token_to_id("<|endoftext|>");
  EXPECT_EQ(r.eos_id, eos);
  EXPECT_EQ(r.bos_id, -1);
  EXPECT_EQ(r.examples, 2);
  EXPECT_EQ(r.prompt_response, 2);
  EXPECT_EQ(r.train.examples, 2);
  EXPECT_EQ(r.train.windows, 2);  // padded: one example per window
  EXPECT_EQ(r.val.examples, 0);

  std::vector<uint32_t> want;
  std::vector<uint8_t> want_mask;
  std::vector<int64_t> want_bounds;
  const std::pair<const char*, const char*> pairs[] = {{"What is the capital of France?", " Paris."},
                                                       {"Hello, world!", " Hi there, how are you?"}};
  for (const auto& [prompt, response] : pairs) {
    const size_t start = want.size();
    put(want, want_mask, tok.encode(prompt), 0);
    put(want, want_mask, tok.encode(response), 1);
    put(want, want_mask, {eos}, 1);
    want_bounds.push_back(static_cast<int64_t>(start));
    want_bounds.push_back(static_cast<int64_t>(want.size() - start));
    put(want, want_mask, std::vector<uint32_t>(64 - (want.size() - start), eos), 0);  // padding
  }
  const TokenStream s(dir.file("out/train_000000.bin"), 0, /*masks=*/true);
  EXPECT_EQ(stream_tokens(s), want);
  EXPECT_EQ(stream_mask(s), want_mask);
  EXPECT_EQ(s.trained(), r.train.trained);
  EXPECT_EQ(examples_of(dir.file("out/train_000000.examples")), want_bounds);

  std::ifstream in(dir.file("out/meta.json"));
  const auto meta = nlohmann::json::parse(in);
  EXPECT_EQ(meta["loss_mask"], true);
  EXPECT_EQ(meta["packing"], "pad");
  EXPECT_EQ(meta["context"], 63);
  EXPECT_EQ(meta["window"], 64);
  EXPECT_EQ(meta["vocab_size"], tok.vocab_size());
  EXPECT_EQ(meta["token_bytes"], 2);
  EXPECT_EQ(meta["train"]["examples"], 2);
  EXPECT_EQ(meta["tokenizer"]["eos_token"], "<|endoftext|>");
}

TEST(DataJsonl, BosComesFirstAndIsNeverTrained) {
  TempDir dir;
  const std::string tok_path = tokenizer_in(dir, "llama3.json");
  write_text(dir.file("a.jsonl"), "{\"prompt\": \"\", \"response\": \"Yes.\"}\n");
  const JsonlCorpusReport r = write_jsonl_corpus(options(dir, tok_path, {dir.file("a.jsonl")}));
  const Tokenizer tok = Tokenizer::from_file(tok_path);
  EXPECT_EQ(r.bos_id, *tok.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(r.eos_id, *tok.token_to_id("<|end_of_text|>"));
  const TokenStream s(dir.file("out/train_000000.bin"), 0, true);
  std::vector<uint32_t> want = {static_cast<uint32_t>(r.bos_id)};
  std::vector<uint8_t> mask = {0};
  put(want, mask, tok.encode("Yes."), 1);
  put(want, mask, {static_cast<uint32_t>(r.eos_id)}, 1);
  const std::vector<uint32_t> got = stream_tokens(s);
  ASSERT_EQ(got.size(), 64u);
  EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.begin() + static_cast<long>(want.size())), want);
  const std::vector<uint8_t> got_mask = stream_mask(s);
  EXPECT_EQ(std::vector<uint8_t>(got_mask.begin(), got_mask.begin() + static_cast<long>(mask.size())), mask);

  // Without a bos and with an empty prompt, the response's first token starts the example: it has nothing
  // before it to be predicted from, so it is not trained on.
  JsonlCorpusOptions o = options(dir, tok_path, {dir.file("a.jsonl")});
  o.bos_token = "none";
  write_jsonl_corpus(o);
  const TokenStream t(dir.file("out/train_000000.bin"), 0, true);
  EXPECT_EQ(t.at(0), tok.encode("Yes.")[0]);
  EXPECT_EQ(t.mask_at(0), 0);
  EXPECT_EQ(t.mask_at(1), 1);
}

TEST(DataJsonl, ChatsTrainOnAssistantContentsAndTheirEndTokenOnly) {
  TempDir dir;
  const std::string tok_path = tokenizer_in(dir, "gpt2.json");
  write_text(dir.file("c.jsonl"),
             R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
             R"( {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"},)"
             R"( {"role": "assistant", "content": "Goodbye."}]})"
             "\n");
  JsonlCorpusOptions chat_opt = options(dir, tok_path, {dir.file("c.jsonl")});
  chat_opt.context = 127;
  const JsonlCorpusReport r = write_jsonl_corpus(chat_opt);
  EXPECT_EQ(r.chat, 1);
  EXPECT_EQ(r.template_from, "the default template");
  const Tokenizer tok = Tokenizer::from_file(tok_path);
  const uint32_t eos = static_cast<uint32_t>(r.eos_id);
  std::vector<uint32_t> want;
  std::vector<uint8_t> mask;
  const std::pair<const char*, const char*> messages[] = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}, {"assistant", "Goodbye."}};
  for (const auto& [role, content] : messages) {
    const bool assistant = std::string(role) == "assistant";
    put(want, mask, tok.encode("<|" + std::string(role) + "|>\n"), 0);
    put(want, mask, tok.encode(content), assistant ? 1 : 0);
    if (assistant) put(want, mask, {eos}, 1);
    put(want, mask, tok.encode("\n"), 0);
  }
  const TokenStream s(dir.file("out/train_000000.bin"), 0, true);
  const std::vector<uint32_t> got = stream_tokens(s);
  const std::vector<uint8_t> got_mask = stream_mask(s);
  ASSERT_LE(want.size(), got.size());
  EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.begin() + static_cast<long>(want.size())), want);
  EXPECT_EQ(std::vector<uint8_t>(got_mask.begin(), got_mask.begin() + static_cast<long>(want.size())), mask);
  EXPECT_EQ(s.trained(), static_cast<int64_t>(tok.encode("Hello!").size() + tok.encode("Goodbye.").size() + 2));

  // A template given: its text around {content}; an end token that opens the text after {content} is the
  // one trained on, not added twice.
  JsonlCorpusOptions o = chat_opt;
  o.chat_template = "[{role}]: {content}<|endoftext|>\n";
  const JsonlCorpusReport r2 = write_jsonl_corpus(o);
  EXPECT_EQ(r2.template_from, "--template");
  const TokenStream t(dir.file("out/train_000000.bin"), 0, true);
  std::vector<uint32_t> want2;
  std::vector<uint8_t> mask2;
  for (const auto& [role, content] : messages) {
    const bool assistant = std::string(role) == "assistant";
    put(want2, mask2, tok.encode("[" + std::string(role) + "]: "), 0);
    put(want2, mask2, tok.encode(content), assistant ? 1 : 0);
    if (assistant) {
      put(want2, mask2, {eos}, 1);
      put(want2, mask2, tok.encode("\n"), 0);
    } else {
      put(want2, mask2, tok.encode("<|endoftext|>\n"), 0);
    }
  }
  const std::vector<uint32_t> got2 = stream_tokens(t);
  const std::vector<uint8_t> got_mask2 = stream_mask(t);
  EXPECT_EQ(std::vector<uint32_t>(got2.begin(), got2.begin() + static_cast<long>(want2.size())), want2);
  EXPECT_EQ(std::vector<uint8_t>(got_mask2.begin(), got_mask2.begin() + static_cast<long>(want2.size())), mask2);
}

TEST(DataJsonl, PackedExamplesStayWholeInTheirWindows) {
  TempDir dir;
  const std::string tok_path = tokenizer_in(dir, "llama3.json");
  std::string lines;
  for (int i = 0; i < 12; ++i)
    lines += "{\"prompt\": \"Question number " + std::to_string(i) + " is here\", \"response\": \" Answer " +
             std::string(static_cast<size_t>(i % 4 + 1), 'x') + "\"}\n";
  write_text(dir.file("p.jsonl"), lines);
  JsonlCorpusOptions o = options(dir, tok_path, {dir.file("p.jsonl")});
  o.context = 63;
  o.pack = true;
  o.val_fraction = 0.25;
  const JsonlCorpusReport r = write_jsonl_corpus(o);
  EXPECT_EQ(r.train.examples, 9);
  EXPECT_EQ(r.val.examples, 3);  // the last quarter
  EXPECT_LT(r.train.windows, 9);  // several examples share a window
  const std::vector<int64_t> b = examples_of(dir.file("out/train_000000.examples"));
  ASSERT_EQ(b.size(), 18u);
  const TokenStream s(dir.file("out/train_000000.bin"), 0, true);
  EXPECT_EQ(s.size(), r.train.windows * 64);
  for (size_t e = 0; e < 9; ++e) {
    const int64_t start = b[2 * e], len = b[2 * e + 1];
    EXPECT_EQ(start / 64, (start + len - 1) / 64) << "example " << e << " crosses a window";
    if (e > 0) {
      EXPECT_GE(start, b[2 * e - 2] + b[2 * e - 1]);
    }
    EXPECT_EQ(s.at(start), static_cast<uint32_t>(r.bos_id));  // each example starts with bos, untrained
    EXPECT_EQ(s.mask_at(start), 0);
    EXPECT_EQ(s.at(start + len - 1), static_cast<uint32_t>(r.eos_id));
    EXPECT_EQ(s.mask_at(start + len - 1), 1);
  }
  const TokenStream v(dir.file("out/val_000000.bin"), 0, true);
  EXPECT_EQ(v.size(), r.val.windows * 64);
}

TEST(DataJsonl, PlainJinjaTemplatesAreReadAndOthersRefused) {
  // ChatML as a plain loop, with the generation prompt after it.
  const char* chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
      "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  std::string why;
  auto t = plain_chat_template(chatml, &why);
  ASSERT_TRUE(t.has_value()) << why;
  EXPECT_EQ(t->before, "<|im_start|>{role}\n");
  EXPECT_EQ(t->after, "<|im_end|>\n");
  // Text between tags, bos_token first, whitespace markers and trim_blocks' newline.
  t = plain_chat_template("{{ bos_token }}{% for message in messages -%}\n### {{ message.role }}:\n"
                          "{{ message[\"content\"] }}\n\n{%- endfor %}\n", &why);
  ASSERT_TRUE(t.has_value()) << why;
  EXPECT_EQ(t->before, "### {role}:\n");
  EXPECT_EQ(t->after, "");
  // Llama 3's template sets variables and branches: not plain.
  const char* llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
      "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}";
  EXPECT_FALSE(plain_chat_template(llama3, &why).has_value());
  EXPECT_NE(why.find("set loop_messages"), std::string::npos) << why;
  EXPECT_FALSE(plain_chat_template("{% for message in messages %}{{ message['content'] | trim }}{% endfor %}", &why));
  EXPECT_NE(why.find("trim"), std::string::npos) << why;
  EXPECT_FALSE(plain_chat_template("{% for message in messages %}{{ message['role'] }}{% endfor %}", &why));
  EXPECT_FALSE(plain_chat_template("{% for message in messages %}{{ message['content'] }}", &why));

  expect_input_error([] { parse_chat_template("<|{role}|> no content here", "--template"); },
                     {"--template", "has no {content}"});
  expect_input_error([] { parse_chat_template("{content}{content}", "--template"); }, {"more than once"});
}

TEST(DataJsonl, TokenizerConfigGivesTokensAndAPlainTemplate) {
  TempDir dir;
  const std::string tok_path = tokenizer_in(dir, "llama3.json");
  write_text(dir.file("c.jsonl"),
             R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})" "\n");
  write_text(dir.file("tokenizer_config.json"),
             R"({"bos_token": {"content": "<|begin_of_text|>"}, "eos_token": "<|reserved_0|>", )"
             R"("chat_template": "{% for message in messages %}<{{ message['role'] }}>{{ message['content'] }})"
             R"(<|reserved_0|>{% endfor %}"})");
  const JsonlCorpusReport r = write_jsonl_corpus(options(dir, tok_path, {dir.file("c.jsonl")}));
  const Tokenizer tok = Tokenizer::from_file(tok_path);
  EXPECT_EQ(r.eos_id, *tok.token_to_id("<|reserved_0|>"));
  EXPECT_NE(r.template_from.find("tokenizer_config.json"), std::string::npos) << r.template_from;
  EXPECT_EQ(r.chat_template.before, "<{role}>");
  EXPECT_EQ(r.chat_template.after, "<|reserved_0|>");
  const TokenStream s(dir.file("out/train_000000.bin"), 0, true);
  std::vector<uint32_t> want = {static_cast<uint32_t>(r.bos_id)};
  std::vector<uint8_t> mask = {0};
  put(want, mask, tok.encode("<user>"), 0);
  put(want, mask, tok.encode("Hi"), 0);
  put(want, mask, tok.encode("<|reserved_0|>"), 0);
  put(want, mask, tok.encode("<assistant>"), 0);
  put(want, mask, tok.encode("Hello"), 1);
  put(want, mask, {static_cast<uint32_t>(r.eos_id)}, 1);
  const std::vector<uint32_t> got = stream_tokens(s);
  const std::vector<uint8_t> got_mask = stream_mask(s);
  EXPECT_EQ(std::vector<uint32_t>(got.begin(), got.begin() + static_cast<long>(want.size())), want);
  EXPECT_EQ(std::vector<uint8_t>(got_mask.begin(), got_mask.begin() + static_cast<long>(want.size())), mask);

  // A template tandem cannot read is refused, saying to give --template; prompt/response lines need none.
  write_text(dir.file("tokenizer_config.json"),
             R"({"chat_template": "{% for message in messages %}{% if message['role'] == 'user' %}U{% endif %})"
             R"({{ message['content'] }}{% endfor %}"})");
  expect_input_error([&] { write_jsonl_corpus(options(dir, tok_path, {dir.file("c.jsonl")})); },
                     {"tokenizer_config.json", "chat_template", "cannot run", "--template"});
  write_text(dir.file("p.jsonl"), "{\"prompt\": \"a\", \"response\": \"b\"}\n");
  EXPECT_EQ(write_jsonl_corpus(options(dir, tok_path, {dir.file("p.jsonl")})).train.examples, 1);
}

TEST(DataJsonl, BadLinesAreRefusedNamingFileAndLine) {
  TempDir dir;
  const std::string tok_path = tokenizer_in(dir, "gpt2.json");
  const std::string good = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  auto refused = [&](const std::string& third_line, const std::vector<std::string>& fragments) {
    write_text(dir.file("bad.jsonl"), good + "\n" + third_line + "\n" + good);
    std::vector<std::string> all = {"'" + dir.file("bad.jsonl") + "' line 3"};
    all.insert(all.end(), fragments.begin(), fragments.end());
    expect_input_error([&] { write_jsonl_corpus(options(dir, tok_path, {dir.file("bad.jsonl")})); }, all);
    EXPECT_FALSE(fs::exists(dir.file("out/meta.json")));
  };
  refused("{\"prompt\": \"a\", \"response\": ", {"is not JSON"});
  refused("[1, 2]", {"not a JSON object"});
  refused("{\"prompt\": \"a\"}", {"no \"response\""});
  refused("{\"question\": \"a\", \"answer\": \"b\"}", {"neither", "\"answer\", \"question\""});
  refused("{\"prompt\": \"a\", \"response\": \"\"}", {"\"response\" is empty"});
  refused("{\"prompt\": 3, \"response\": \"b\"}", {"\"prompt\" is number"});
  refused("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", {"no message of role \"assistant\""});
  refused("{\"messages\": [{\"role\": \"user\"}]}", {"message 1", "no \"content\""});
  refused("{\"messages\": [{\"role\": \"assistant\", \"content\": \"\"}]}", {"message 1", "empty \"content\""});
  refused("{\"prompt\": \"" + std::string(300, 'z') + " z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z "
          "z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z z\", \"response\": \"b\"}",
          {"tokens long", "--context 63", "raise --context", "--skip-long"});

  // --skip-long leaves such an example out instead.
  write_text(dir.file("long.jsonl"), good + "{\"prompt\": \"" + std::string(100, ' ') + std::string(40, 'q') +
                                         " q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q q "
                                         "q q q q q q q q q q q q q q q q q q q q q q\", \"response\": \"b\"}\n");
  JsonlCorpusOptions o = options(dir, tok_path, {dir.file("long.jsonl")});
  o.skip_long = true;
  const JsonlCorpusReport r = write_jsonl_corpus(o);
  EXPECT_EQ(r.skipped_long, 1);
  EXPECT_EQ(r.train.examples, 1);

  // A tokenizer without an end token it knows, and none named.
  write_text(dir.file("a.jsonl"), good);
  JsonlCorpusOptions e = options(dir, tok_path, {dir.file("a.jsonl")});
  e.eos_token = "<|nothing|>";
  expect_input_error([&] { write_jsonl_corpus(e); }, {"--eos", "<|nothing|>"});
  // One example cannot be split.
  JsonlCorpusOptions v = options(dir, tok_path, {dir.file("a.jsonl")});
  v.val_fraction = 0.1;
  expect_input_error([&] { write_jsonl_corpus(v); }, {"cannot be split", "--val 0"});
}

}  // namespace
}  // namespace tandem::data
