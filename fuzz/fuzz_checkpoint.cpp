// libFuzzer harness: the checkpoint reader must answer any bytes with tensors or a tandem::Error,
// and a refused file must leave the model untouched. Built with FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION,
// the header checksum is not enforced, so that mutations reach the header's parser.
#include "fuzz_input.h"
#include "fuzz_model.h"
#include "tandem/checkpoint.h"
#include "tandem/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static tandem::fuzz::MemFile file;
  static tandem::nn::ModulePtr model = tandem::fuzz::small_model();
  const std::string& path = file.hold(data, size);
  try {
    tandem::read_checkpoint_tensors(path);
  } catch (const tandem::Error&) {
  }
  auto before = model->parameters()[0].to_vector<float>();
  try {
    tandem::load_checkpoint(path, *model, nullptr);
  } catch (const tandem::Error&) {
    if (model->parameters()[0].to_vector<float>() != before) __builtin_trap();
  }
  return 0;
}
