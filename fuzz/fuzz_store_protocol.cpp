// libFuzzer harness: the store's frame decoder must reject or accept any body without reading out of
// bounds, and whatever it accepts must encode back to the same bytes.
#include "distributed/rendezvous/store_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace proto = tandem::dist::proto;
  uint8_t code = 0;
  std::vector<std::string> fields;
  const char* body = reinterpret_cast<const char*>(data);
  if (!proto::decode(body, size, code, fields)) return 0;
  std::string frame = proto::encode(code, fields);
  if (frame.size() != size + 4 || proto::get_u32(frame.data()) != size || frame.compare(4, size, body, size) != 0)
    __builtin_trap();
  return 0;
}
