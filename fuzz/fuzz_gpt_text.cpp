// libFuzzer harness: the text a GPT's data and checkpoints bring in. A GPT configuration or a checkpoint's
// meta data (JSON) gives a valid configuration or a tandem::Error; Gutenberg's licence text is found or not,
// the body a span inside the text.
#include <string>
#include <string_view>

#include "tandem/data/text_corpus.h"
#include "tandem/error.h"
#include "tandem/nn/gpt.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int what = 0; what < 2; ++what) {
    try {
      const tandem::nn::GptConfig c = what == 0 ? tandem::nn::gpt_config_from_json(text)
                                                : tandem::nn::gpt_config_from_meta(text, "fuzz input");
      tandem::nn::check_gpt_config(c);  // what was accepted must be valid
      if (tandem::nn::gpt_config_from_json(tandem::nn::gpt_config_to_json(c)).width != c.width) __builtin_trap();
    } catch (const tandem::Error&) {
    }
  }
  const tandem::data::TextSpan span = tandem::data::gutenberg_body(std::string_view(text));
  if (span.begin > span.end || span.end > size) __builtin_trap();
  return 0;
}
