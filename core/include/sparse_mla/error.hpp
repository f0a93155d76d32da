// The one exception type of the library: every rejected call, every failed
// native runtime call, every malformed file ends up here.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace sparse_mla {

// `where` names the entry point or native call, `what()` is the full message
// "where: why" that the CLI prints on one line.
class Error : public std::runtime_error {
 public:
  Error(std::string where, const std::string& why)
      : std::runtime_error(where + ": " + why), where_(std::move(where)) {}
  const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

// fail("convert_topk", "logical top-k has ", rows, " rows but ...")
template <class... Args>
[[noreturn]] void fail(const std::string& where, const Args&... args) {
  throw Error(where, detail::concat(args...));
}

}  // namespace sparse_mla
