#include "tandem/error.h"

namespace tandem::detail {

void throw_error(Error::Kind kind, const std::string& msg) { throw Error(kind, msg); }

void throw_internal(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(Error::Kind::Internal, cat("internal error: ", cond, " failed at ", file, ":", line,
                                         msg.empty() ? "" : ": ", msg));
}

}  // namespace tandem::detail
