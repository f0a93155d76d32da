#include "validation/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace sparse_mla {
namespace {

using json = nlohmann::json;

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::size_t kQuoteLimit = 80;

// ---- message helpers: everything printed stays on one line ----

// Cuts `s` to at most `limit` bytes without splitting a UTF-8 sequence.
std::string clip(const std::string& s, std::size_t limit) {
  if (s.size() <= limit) return s;
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

// 'name' with control characters, quotes and backslashes escaped, clipped.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char ch : clip(s, kQuoteLimit)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += ch;
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::string tensor_label(const std::string& name) { return "tensor " + quote(name); }

// A JSON value as short one-line text (dump() escapes control characters).
std::string show(const json& j) {
  try {
    return clip(j.dump(-1, ' ', false, json::error_handler_t::replace), kQuoteLimit);
  } catch (const std::exception&) {
    return "<unprintable>";
  }
}

std::string show_shape(const std::vector<std::int64_t>& shape, bool wildcards = false) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += (wildcards && shape[i] < 0) ? std::string("*") : std::to_string(shape[i]);
  }
  return out + "]";
}

// ---- validation helpers ----

// Offset of the first byte that breaks UTF-8 (RFC 3629: no overlong forms,
// no surrogates, nothing past U+10FFFF), or size when the text is valid.
std::size_t utf8_error_at(const std::uint8_t* p, std::size_t size) {
  std::size_t i = 0;
  while (i < size) {
    const std::uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (size - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return size;
}

bool valid_utf8(const std::string& s) {
  return utf8_error_at(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()) == s.size();
}

// Deepest bracket nesting of JSON text outside strings (valid UTF-8 input, so
// multi-byte sequences never look like ASCII brackets or quotes).
int json_depth(const std::uint8_t* p, std::size_t size) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < size; ++i) {
    const std::uint8_t c = p[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

// Product of dims, 0 if any dim is 0. False on a negative dim or overflow.
bool checked_numel(const std::vector<std::int64_t>& shape, std::int64_t& out) {
  for (std::int64_t d : shape) {
    if (d < 0) return false;
    if (d == 0) {
      out = 0;
      return true;
    }
  }
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (n > kInt64Max / d) return false;
    n *= d;
  }
  out = n;
  return true;
}

bool checked_bytes(std::int64_t numel, DType dtype, std::uint64_t& out) {
  const auto size = static_cast<std::int64_t>(dtype_size(dtype));
  if (numel > kInt64Max / size) return false;
  out = static_cast<std::uint64_t>(numel * size);
  return out <= std::numeric_limits<std::size_t>::max();
}

enum class IntCheck { ok, not_integer, negative, too_large };

// A JSON number that is an integer in [0, INT64_MAX].
IntCheck json_nonneg_int(const json& j, std::uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<std::uint64_t>();
    return out > static_cast<std::uint64_t>(kInt64Max) ? IntCheck::too_large : IntCheck::ok;
  }
  if (j.is_number_integer()) {  // signed storage: negative, or "-0"
    const std::int64_t v = j.get<std::int64_t>();
    if (v < 0) return IntCheck::negative;
    out = static_cast<std::uint64_t>(v);
    return IntCheck::ok;
  }
  return IntCheck::not_integer;
}

// One header entry after validation.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin, end;
};

struct Layout {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;  // sorted by data_offsets
};

// Parses the JSON, remembering the first key repeated inside one object
// (nlohmann would silently keep the last).
json parse_json_strict(const std::uint8_t* p, std::size_t size, const std::string& origin) {
  std::vector<std::set<std::string>> open_objects;
  bool duplicate = false;
  std::string duplicate_key;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            !duplicate) {
          duplicate = true;
          duplicate_key = parsed.get<std::string>();
        }
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(p, p + size, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line ..."
    std::string why = e.what();
    const auto close = why.find("] ");
    if (close != std::string::npos) why = why.substr(close + 2);
    fail(origin, "header is not JSON: ", clip(why, 200));
  }
  if (duplicate) fail(origin, "header repeats key ", quote(duplicate_key), " in one object");
  return root;
}

// Stage 1: the header's bytes are JSON text (UTF-8, no NUL, no byte-order
// mark, not nested too deep), parsed strictly into an object.
json parse_header_json(const std::uint8_t* header, std::size_t header_size, const std::string& origin) {
  const std::size_t bad = utf8_error_at(header, header_size);
  if (bad != header_size) {
    std::ostringstream why;
    why << "header is not valid UTF-8 (byte 0x" << std::hex << static_cast<int>(header[bad])
        << std::dec << " at header offset " << bad << ")";
    fail(origin, why.str());
  }
  // nlohmann stops at a NUL byte as if the input ended there, so "{}\0junk"
  // would pass; raw NUL is never valid in JSON text.
  const auto* nul = static_cast<const std::uint8_t*>(std::memchr(header, 0, header_size));
  if (nul != nullptr) {
    fail(origin, "header contains a NUL byte at header offset ", nul - header);
  }
  if (header_size >= 3 && header[0] == 0xEF && header[1] == 0xBB && header[2] == 0xBF) {
    fail(origin, "header starts with a UTF-8 byte-order mark");
  }
  if (json_depth(header, header_size) > SafetensorsFile::kMaxHeaderDepth) {
    fail(origin, "header nests JSON deeper than ", SafetensorsFile::kMaxHeaderDepth, " levels");
  }
  json root = parse_json_strict(header, header_size, origin);
  if (!root.is_object()) fail(origin, "header is not a JSON object (it is ", root.type_name(), ")");
  return root;
}

// Stage 2a: the "__metadata__" entry, an object of strings.
void parse_metadata(const json& value, const std::string& origin, std::map<std::string, std::string>& metadata) {
  if (!value.is_object()) {
    fail(origin, "'__metadata__' is not an object of strings (it is ", value.type_name(), ")");
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      fail(origin, "metadata key ", quote(key), " is not a string (", v.type_name(), " ", show(v), ")");
    }
    metadata.emplace(key, v.get<std::string>());
  }
}

// Stage 2b: one tensor entry has exactly the keys dtype, shape, data_offsets.
void check_entry_keys(const json& value, const std::string& t, const std::string& origin) {
  if (!value.is_object()) fail(origin, t, ": entry is not an object (it is ", show(value), ")");
  for (const auto& [key, v] : value.items()) {
    (void)v;
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(origin, t, ": unknown key ", quote(key), " (allowed: dtype, shape, data_offsets)");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) fail(origin, t, ": missing '", key, "'");
  }
}

DType parse_entry_dtype(const json& dt, const std::string& t, const std::string& origin) {
  if (!dt.is_string()) fail(origin, t, ": dtype is not a string (", show(dt), ")");
  DType dtype{};
  if (!parse_dtype(dt.get<std::string>(), dtype)) {
    fail(origin, t, ": unknown dtype ", quote(dt.get<std::string>()), " (supported: I32, I16, U8, BF16, F32, I64)");
  }
  return dtype;
}

// The shape, and the bytes it needs in `dtype` (both checked against overflow).
std::vector<std::int64_t> parse_entry_shape(const json& sh, DType dtype, const std::string& t, const std::string& origin,
                                            std::uint64_t& need) {
  if (!sh.is_array()) fail(origin, t, ": shape is not an array (", show(sh), ")");
  std::vector<std::int64_t> shape;
  for (std::size_t i = 0; i < sh.size(); ++i) {
    std::uint64_t d = 0;
    switch (json_nonneg_int(sh[i], d)) {
      case IntCheck::ok:
        break;
      case IntCheck::negative:
        fail(origin, t, ": negative dimension shape[", i, "] = ", show(sh[i]), " in shape ", show(sh));
      case IntCheck::not_integer:
        fail(origin, t, ": shape[", i, "] = ", show(sh[i]), " is not an integer");
      case IntCheck::too_large:
        fail(origin, t, ": shape[", i, "] = ", show(sh[i]), " overflows int64");
    }
    shape.push_back(static_cast<std::int64_t>(d));
  }
  std::int64_t numel = 0;
  if (!checked_numel(shape, numel)) {
    fail(origin, t, ": shape ", show(sh), " has more elements than int64 can count (shape product overflow)");
  }
  if (!checked_bytes(numel, dtype, need)) {
    fail(origin, t, ": byte count of shape ", show(sh), " of ", dtype_name(dtype), " overflows int64 (", numel,
         " elements)");
  }
  return shape;
}

// [begin, end) inside the data section, holding exactly `need` bytes.
void parse_entry_offsets(const json& off, const json& sh, std::uint64_t need, std::uint64_t data_size, Entry& e,
                         const std::string& t, const std::string& origin) {
  if (!off.is_array() || off.size() != 2) {
    fail(origin, t, ": data_offsets is not an array of two integers (", show(off), ")");
  }
  std::uint64_t be[2] = {0, 0};
  for (std::size_t i = 0; i < 2; ++i) {
    switch (json_nonneg_int(off[i], be[i])) {
      case IntCheck::ok:
        break;
      case IntCheck::negative:
        fail(origin, t, ": data_offsets ", show(off), " has a negative offset");
      case IntCheck::not_integer:
        fail(origin, t, ": data_offsets ", show(off), " is not two integers");
      case IntCheck::too_large:
        fail(origin, t, ": data_offsets ", show(off), " overflows int64");
    }
  }
  e.begin = be[0];
  e.end = be[1];
  if (e.begin > e.end) {
    fail(origin, t, ": data_offsets ", show(off), " are reversed (begin > end)");
  }
  if (e.end > data_size) {
    fail(origin, t, ": data_offsets ", show(off), " end past the data section (", data_size, " bytes)");
  }
  if (e.end - e.begin != need) {
    fail(origin, t, ": data_offsets ", show(off), " hold ", e.end - e.begin, " bytes but shape ", show(sh), " of ",
         dtype_name(e.dtype), " needs ", need, " bytes");
  }
}

// Stage 2: one tensor entry, validated.
Entry parse_entry(const std::string& name, const json& value, std::uint64_t data_size, const std::string& origin) {
  const std::string t = tensor_label(name);
  if (name.empty()) fail(origin, "header has a tensor with an empty name");
  check_entry_keys(value, t, origin);
  Entry e;
  e.name = name;
  e.dtype = parse_entry_dtype(value.at("dtype"), t, origin);
  std::uint64_t need = 0;
  e.shape = parse_entry_shape(value.at("shape"), e.dtype, t, origin, need);
  parse_entry_offsets(value.at("data_offsets"), value.at("shape"), need, data_size, e, t, origin);
  return e;
}

// Stage 3: the tensors tile the data section exactly, in offset order.
void check_coverage(std::vector<Entry>& entries, std::uint64_t data_size, const std::string& origin) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < at) {
      fail(origin, "tensors ", quote(prev->name), " [", prev->begin, ", ", prev->end, "] and ", quote(e.name), " [",
           e.begin, ", ", e.end, "] overlap");
    }
    if (e.begin > at) {
      if (prev) {
        fail(origin, "gap of ", e.begin - at, " bytes between tensor ", quote(prev->name), " (ends at ", at,
             ") and tensor ", quote(e.name), " (begins at ", e.begin, ")");
      }
      fail(origin, "gap of ", e.begin, " bytes before the first tensor ", quote(e.name), " (begins at ", e.begin,
           ", not 0)");
    }
    at = e.end;
    prev = &e;
  }
  if (at != data_size) {
    if (prev) {
      fail(origin, data_size - at, " unused bytes after the last tensor ", quote(prev->name), " (ends at ", at,
           ", data section is ", data_size, " bytes)");
    }
    fail(origin, "data section has ", data_size, " bytes but the header lists no tensors");
  }
}

Layout parse_header(const std::uint8_t* header, std::size_t header_size, std::uint64_t data_size,
                    const std::string& origin) {
  const json root = parse_header_json(header, header_size, origin);
  Layout layout;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      parse_metadata(value, origin, layout.metadata);
    } else {
      layout.entries.push_back(parse_entry(name, value, data_size, origin));
    }
  }
  check_coverage(layout.entries, data_size, origin);
  return layout;
}

std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Checks the 8-byte length field against the file size; returns N.
std::uint64_t check_header_length(const std::uint8_t* prefix, std::uint64_t file_size,
                                  const std::string& origin) {
  if (file_size < 8) {
    fail(origin, "file is ", file_size, " bytes, shorter than the 8-byte header length field");
  }
  const std::uint64_t n = read_u64_le(prefix);
  if (n > SafetensorsFile::kMaxHeaderBytes) {
    fail(origin, "header length ", n, " exceeds the limit of ", SafetensorsFile::kMaxHeaderBytes,
         " bytes");
  }
  if (n > file_size - 8) {
    fail(origin, "header length ", n, " runs past the end of the file (", file_size - 8,
         " bytes follow the length field)");
  }
  if (n < 2) fail(origin, "header length ", n, " is too short for a JSON object");
  return n;
}

SafetensorsFile build(const Layout& layout, const std::string& origin,
                      const std::function<void(const Entry&, std::uint8_t*)>& fill) {
  SafetensorsFile file(origin);
  for (const auto& [k, v] : layout.metadata) file.set_meta(k, v);
  for (const Entry& e : layout.entries) {
    TensorRecord t;
    t.name = e.name;
    t.dtype = e.dtype;
    t.shape = e.shape;
    t.bytes.resize(static_cast<std::size_t>(e.end - e.begin));  // checked against the data size
    if (!t.bytes.empty()) fill(e, t.bytes.data());
    file.add(std::move(t));
  }
  return file;
}

}  // namespace

// ---- TensorRecord ----

std::int64_t TensorRecord::numel() const {
  std::int64_t n = 0;
  if (!checked_numel(shape, n)) {
    fail(tensor_label(name), "shape ", show_shape(shape), " has a negative dim or overflows int64");
  }
  return n;
}

std::size_t TensorRecord::byte_size() const {
  std::uint64_t b = 0;
  if (!checked_bytes(numel(), dtype, b)) {
    fail(tensor_label(name), "byte count of shape ", show_shape(shape), " of ", dtype_name(dtype),
         " overflows");
  }
  return static_cast<std::size_t>(b);
}

void TensorRecord::check_access(DType want, std::size_t elem_size, std::size_t elem_align) const {
  if (want != dtype) {
    fail(tensor_label(name), "is ", dtype_name(dtype), ", read as ", dtype_name(want));
  }
  if (elem_size != dtype_size(dtype)) {
    fail(tensor_label(name), "element size ", elem_size, " does not match ", dtype_name(dtype));
  }
  if (bytes.size() != byte_size()) {
    fail(tensor_label(name), "holds ", bytes.size(), " bytes but shape ", show_shape(shape), " of ",
         dtype_name(dtype), " needs ", byte_size());
  }
  if (reinterpret_cast<std::uintptr_t>(bytes.data()) % elem_align != 0) {
    fail(tensor_label(name), "data is not aligned for ", dtype_name(dtype));
  }
}

// ---- SafetensorsFile: reading ----

SafetensorsFile SafetensorsFile::parse(const std::uint8_t* data, std::size_t size,
                                       const std::string& origin) {
  if (data == nullptr && size != 0) fail(origin, "null data pointer with size ", size);
  const std::uint64_t n = check_header_length(data, size, origin);
  const std::uint8_t* payload = data + 8 + n;
  const std::uint64_t data_size = size - 8 - n;
  const Layout layout = parse_header(data + 8, static_cast<std::size_t>(n), data_size, origin);
  return build(layout, origin, [&](const Entry& e, std::uint8_t* out) {
    std::memcpy(out, payload + e.begin, static_cast<std::size_t>(e.end - e.begin));
  });
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    fail(path, "cannot open: ", ec ? ec.message() : std::string("no such file"));
  }
  if (!fs::is_regular_file(st)) fail(path, "cannot open: not a regular file");
  const std::uintmax_t file_size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot read the file size: ", ec.message());

  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open: ", std::strerror(errno));
  auto read_exact = [&](std::uint8_t* out, std::uint64_t count, const char* what) {
    in.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(count));
    if (static_cast<std::uint64_t>(in.gcount()) != count) {
      fail(path, "short read of ", what, " (", in.gcount(), " of ", count,
           " bytes; did the file change while being read?)");
    }
  };

  std::uint8_t prefix[8] = {0};
  if (file_size >= 8) read_exact(prefix, 8, "the header length");
  const std::uint64_t n = check_header_length(prefix, file_size, path);
  std::vector<std::uint8_t> header(static_cast<std::size_t>(n));  // n <= kMaxHeaderBytes and <= file size
  read_exact(header.data(), n, "the header");
  const Layout layout = parse_header(header.data(), header.size(), file_size - 8 - n, path);
  header.clear();
  header.shrink_to_fit();
  // Entries are sorted by offset and tile the data section, so reading them in
  // order reads the file sequentially.
  return build(layout, path, [&](const Entry& e, std::uint8_t* out) {
    read_exact(out, e.end - e.begin, ("tensor " + quote(e.name)).c_str());
  });
}

// ---- SafetensorsFile: writing ----

std::vector<std::uint8_t> SafetensorsFile::serialize() const {
  json header = json::object();
  json meta = json::object();
  for (const auto& [k, v] : metadata_) meta[k] = v;
  header["__metadata__"] = std::move(meta);
  std::uint64_t at = 0;
  for (const std::string& name : names_) {  // sorted
    const TensorRecord& t = tensors_.at(name);
    const std::uint64_t size = t.bytes.size();  // == byte_size(), checked by add()
    header[name] = json{{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + size}}};
    at += size;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception& e) {
    fail(origin_, "cannot encode the header: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    fail(origin_, "header would be ", text.size(), " bytes, over the limit of ", kMaxHeaderBytes);
  }

  std::vector<std::uint8_t> out;
  out.reserve(8 + text.size() + at);
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const std::string& name : names_) {
    const TensorRecord& t = tensors_.at(name);
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  }
  return out;
}

void SafetensorsFile::write(const std::string& path) const {
  const std::vector<std::uint8_t> image = serialize();
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot open ", quote(partial), " for writing: ", std::strerror(errno));
    out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(partial, ignored);
      fail(path, "cannot write ", image.size(), " bytes to ", quote(partial));
    }
  }
  std::error_code ec;
  std::filesystem::rename(partial, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    fail(path, "cannot rename ", quote(partial), " to the target: ", ec.message());
  }
}

// ---- SafetensorsFile: tensors ----

const TensorRecord& SafetensorsFile::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(origin_, "missing tensor ", quote(name));
  return it->second;
}

const TensorRecord& SafetensorsFile::require_rank(const std::string& name, DType dtype,
                                                  std::size_t rank) const {
  const TensorRecord& t = tensor(name);
  if (t.dtype != dtype) {
    fail(origin_, "tensor ", quote(name), " is ", dtype_name(t.dtype), ", expected ", dtype_name(dtype));
  }
  if (t.shape.size() != rank) {
    fail(origin_, "tensor ", quote(name), " has shape ", show_shape(t.shape), " (rank ",
         t.shape.size(), "), expected rank ", rank);
  }
  return t;
}

const TensorRecord& SafetensorsFile::require(const std::string& name, DType dtype,
                                             const std::vector<std::int64_t>& shape) const {
  const TensorRecord& t = tensor(name);
  if (t.dtype != dtype) {
    fail(origin_, "tensor ", quote(name), " is ", dtype_name(t.dtype), ", expected ", dtype_name(dtype));
  }
  bool match = t.shape.size() == shape.size();
  for (std::size_t i = 0; match && i < shape.size(); ++i) {
    match = shape[i] < 0 || shape[i] == t.shape[i];
  }
  if (!match) {
    fail(origin_, "tensor ", quote(name), " has shape ", show_shape(t.shape), ", expected ",
         show_shape(shape, true));
  }
  return t;
}

void SafetensorsFile::add(TensorRecord t) {
  if (t.name.empty()) fail(origin_, "cannot add a tensor with an empty name");
  if (t.name == "__metadata__") fail(origin_, "cannot add a tensor named '__metadata__'");
  if (!valid_utf8(t.name)) fail(origin_, "cannot add tensor ", quote(t.name), ": name is not valid UTF-8");
  if (tensors_.count(t.name)) fail(origin_, "cannot add tensor ", quote(t.name), ": already present");
  std::int64_t numel = 0;
  std::uint64_t need = 0;
  if (!checked_numel(t.shape, numel) || !checked_bytes(numel, t.dtype, need)) {
    fail(origin_, "cannot add tensor ", quote(t.name), ": shape ", show_shape(t.shape),
         " has a negative dim or overflows int64");
  }
  if (t.bytes.size() != need) {
    fail(origin_, "cannot add tensor ", quote(t.name), ": ", t.bytes.size(), " bytes but shape ",
         show_shape(t.shape), " of ", dtype_name(t.dtype), " needs ", need);
  }
  const std::string name = t.name;
  names_.insert(std::upper_bound(names_.begin(), names_.end(), name), name);
  tensors_.emplace(name, std::move(t));
}

// ---- SafetensorsFile: metadata ----

const std::string& SafetensorsFile::meta(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end()) fail(origin_, "missing metadata key ", quote(key));
  return it->second;
}

namespace {
// JSON integer grammar -?(0|[1-9][0-9]*), within int64.
bool parse_json_int(const std::string& s, std::int64_t& out) {
  std::size_t i = 0;
  const bool neg = !s.empty() && s[0] == '-';
  if (neg) i = 1;
  if (i >= s.size()) return false;
  if (s[i] == '0' && i + 1 != s.size()) return false;
  // Accumulate as a negative number so INT64_MIN fits.
  std::int64_t v = 0;
  constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
  for (; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    const int d = s[i] - '0';
    if (v < (kMin + d) / 10) return false;
    v = v * 10 - d;
  }
  if (!neg) {
    if (v == kMin) return false;
    v = -v;
  }
  out = v;
  return true;
}
}  // namespace

std::int64_t SafetensorsFile::meta_int(const std::string& key) const {
  const std::string& s = meta(key);
  std::int64_t v = 0;
  if (!parse_json_int(s, v)) {
    fail(origin_, "metadata ", quote(key), " = ", quote(s), " is not an integer (int64)");
  }
  return v;
}

bool SafetensorsFile::meta_bool(const std::string& key) const {
  const std::string& s = meta(key);
  if (s == "true") return true;
  if (s == "false") return false;
  fail(origin_, "metadata ", quote(key), " = ", quote(s), " is not a boolean ('true' or 'false')");
}

std::vector<std::int64_t> SafetensorsFile::meta_int_list(const std::string& key) const {
  const std::string& s = meta(key);
  auto reject = [&](const std::string& why) {
    fail(origin_, "metadata ", quote(key), " = ", quote(s), " is not a list of integers: ", why);
  };
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  if (s.find('\0') != std::string::npos) reject("contains a NUL byte");
  if (json_depth(p, s.size()) > 1) reject("nested");
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception&) {
    reject("not JSON");
  }
  if (!j.is_array()) reject(std::string("it is a JSON ") + j.type_name());
  std::vector<std::int64_t> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    const json& v = j[i];
    if (v.is_number_unsigned()) {
      if (v.get<std::uint64_t>() > static_cast<std::uint64_t>(kInt64Max)) {
        reject("element " + std::to_string(i) + " overflows int64");
      }
      out.push_back(static_cast<std::int64_t>(v.get<std::uint64_t>()));
    } else if (v.is_number_integer()) {
      out.push_back(v.get<std::int64_t>());
    } else {
      reject("element " + std::to_string(i) + " is " + show(v));
    }
  }
  return out;
}

void SafetensorsFile::set_meta(std::string key, std::string value) {
  if (!valid_utf8(key)) fail(origin_, "metadata key ", quote(key), " is not valid UTF-8");
  if (!valid_utf8(value)) fail(origin_, "metadata ", quote(key), " value is not valid UTF-8");
  metadata_[std::move(key)] = std::move(value);
}

}  // namespace sparse_mla
