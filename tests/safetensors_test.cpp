// Tests of the strict safetensors reader/writer.
//
// Data locations, first match wins:
//   tests/data:  env SPARSE_MLA_TEST_DATA_DIR, the compile definition of that
//                name, SPARSE_MLA_SOURCE_DIR "/tests/data", "tests/data".
//   golden dir:  env SPARSE_MLA_GOLDEN_DIR, the compile definition of that
//                name, the tests/data directory's "golden".
#include "validation/safetensors.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#ifndef SPARSE_MLA_TEST_DATA_DIR
#ifdef SPARSE_MLA_SOURCE_DIR
#define SPARSE_MLA_TEST_DATA_DIR SPARSE_MLA_SOURCE_DIR "/tests/data"
#else
#define SPARSE_MLA_TEST_DATA_DIR "tests/data"
#endif
#endif

namespace fs = std::filesystem;
using sparse_mla::DType;
using sparse_mla::Error;
using sparse_mla::SafetensorsFile;
using sparse_mla::TensorRecord;

namespace {

// The variable wins only where it names something that exists (a machine may
// set it for another checkout).
std::string dir_from(const char* env, const char* fallback) {
  const char* v = std::getenv(env);
  return (v && *v && fs::exists(v)) ? std::string(v) : std::string(fallback);
}
std::string test_data_dir() { return dir_from("SPARSE_MLA_TEST_DATA_DIR", SPARSE_MLA_TEST_DATA_DIR); }
std::string golden_dir() {
#ifdef SPARSE_MLA_GOLDEN_DIR
  return dir_from("SPARSE_MLA_GOLDEN_DIR", SPARSE_MLA_GOLDEN_DIR);
#else
  return dir_from("SPARSE_MLA_GOLDEN_DIR", (test_data_dir() + "/golden").c_str());
#endif
}
std::string malformed_dir() { return test_data_dir() + "/malformed"; }
std::string golden(const std::string& stem) { return golden_dir() + "/" + stem + ".safetensors"; }

const std::vector<std::string> kGoldenStems = {
    "c1_convert_tiny_edges", "c3_convert_tiled_k384_bs16", "c5_convert_bs1",
    "d1_convert_dcp_small",  "d3_convert_dcp_gaps",
    "u1_upconvert_small",    "u3_upconvert_seq_starts",    "u4_upconvert_bs1",
    "h1_hisparse_6steps",    "v4a_gather_small",           "v4b_gather_bs2"};

std::vector<std::uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("test cannot open " + path);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("test cannot write " + path);
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           ("sparse_mla_st_" + std::to_string(std::random_device{}()) + "_" + std::to_string(counter++) +
            "_" + (info ? info->name() : "x"));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Runs f, expects an Error, returns its message ("" and a test failure otherwise).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected sparse_mla::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected sparse_mla::Error, nothing was thrown";
  return "";
}

SafetensorsFile parse_bytes(const std::vector<std::uint8_t>& b, const std::string& origin = "mem") {
  return SafetensorsFile::parse(b.data(), b.size(), origin);
}

// A valid image: 8-byte length, header text, data.
std::vector<std::uint8_t> image(const std::string& header, const std::vector<std::uint8_t>& data = {}) {
  std::vector<std::uint8_t> out;
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void expect_same(const SafetensorsFile& a, const SafetensorsFile& b) {
  EXPECT_EQ(a.names(), b.names());
  EXPECT_EQ(a.metadata(), b.metadata());
  for (const std::string& n : a.names()) {
    if (!b.has(n)) continue;
    const TensorRecord& x = a.tensor(n);
    const TensorRecord& y = b.tensor(n);
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype) << n;
    EXPECT_EQ(x.shape, y.shape) << n;
    EXPECT_TRUE(x.bytes == y.bytes) << n;
  }
}

SafetensorsFile random_file(std::mt19937_64& rng) {
  const DType dtypes[] = {DType::i32, DType::i16, DType::u8, DType::bf16, DType::f32, DType::i64};
  SafetensorsFile f;
  const int count = static_cast<int>(rng() % 12);
  for (int i = 0; i < count; ++i) {
    TensorRecord t;
    t.name = "t" + std::to_string(rng() % 1000) + (i % 3 == 0 ? ".step" + std::to_string(i) : "") +
             (i % 5 == 1 ? "\xc3\xa9\xe2\x82\xac" : "");  // some non-ASCII names
    if (f.has(t.name)) continue;
    t.dtype = dtypes[rng() % 6];
    const int rank = static_cast<int>(rng() % 4);
    for (int d = 0; d < rank; ++d) t.shape.push_back(static_cast<std::int64_t>(rng() % 6));  // zeros too
    t.bytes.resize(t.byte_size());
    for (auto& b : t.bytes) b = static_cast<std::uint8_t>(rng());
    f.add(std::move(t));
  }
  const int metas = static_cast<int>(rng() % 6);
  for (int i = 0; i < metas; ++i) {
    f.set_meta("key" + std::to_string(rng() % 100), std::to_string(static_cast<std::int64_t>(rng())));
  }
  f.set_meta("seq_lens", "[1, 65, 200]");
  f.set_meta("quoted \"text\"", "line1\nline2\t\\ \xe2\x9c\x93");
  f.set_meta("empty", "");
  return f;
}

std::int64_t i32_at(const TensorRecord& t, std::size_t i) { return t.data<std::int32_t>()[i]; }

}  // namespace

// ---------------------------------------------------------------- round trip

TEST(SafetensorsRoundTrip, RandomTensorsAndMetadata) {
  TempDir tmp;
  std::mt19937_64 rng(20240611);
  for (int iter = 0; iter < 50; ++iter) {
    const SafetensorsFile f = random_file(rng);
    const std::string path = tmp.file("rt" + std::to_string(iter) + ".safetensors");
    f.write(path);
    EXPECT_FALSE(fs::exists(path + ".partial"));
    const SafetensorsFile g = SafetensorsFile::read(path);
    expect_same(f, g);
    EXPECT_EQ(g.origin(), path);
    // Deterministic: what we read serializes to the very same bytes.
    EXPECT_TRUE(g.serialize() == slurp(path)) << "iteration " << iter;
    EXPECT_TRUE(f.serialize() == slurp(path)) << "iteration " << iter;
  }
}

TEST(SafetensorsRoundTrip, InsertionOrderDoesNotMatter) {
  auto make = [](bool reversed) {
    std::vector<TensorRecord> ts = {
        TensorRecord::from_values<std::int32_t>("b", {2}, {1, 2}),
        TensorRecord::from_values<std::uint8_t>("a", {3}, {7, 8, 9}),
        TensorRecord::from_values<std::int16_t>("c", {1, 1}, {-5})};
    if (reversed) std::reverse(ts.begin(), ts.end());
    SafetensorsFile f;
    for (auto& t : ts) f.add(std::move(t));
    f.set_meta(reversed ? "z" : "y", "1");
    f.set_meta(reversed ? "y" : "z", "2");
    f.set_meta("y", "1");
    f.set_meta("z", "2");
    return f.serialize();
  };
  EXPECT_TRUE(make(false) == make(true));
}

TEST(SafetensorsRoundTrip, LayoutIsSortedPackedAndPadded) {
  SafetensorsFile f;
  f.add(TensorRecord::from_values<std::int32_t>("zeta", {2}, {1, 2}));
  f.add(TensorRecord::from_values<std::uint8_t>("alpha", {3}, {7, 8, 9}));
  f.add(TensorRecord::from_values<std::int64_t>("mid", {0, 4}, {}));
  f.set_meta("kind", "topk_convert");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"alpha", "mid", "zeta"}));
  const std::vector<std::uint8_t> b = f.serialize();
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<std::size_t>(i)];
  EXPECT_EQ(n % 8, 0u);
  const std::string header(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  EXPECT_NE(header.find(R"("__metadata__":{"kind":"topk_convert"})"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("alpha":{"data_offsets":[0,3],"dtype":"U8","shape":[3]})"), std::string::npos);
  EXPECT_NE(header.find(R"("mid":{"data_offsets":[3,3],"dtype":"I64","shape":[0,4]})"), std::string::npos);
  EXPECT_NE(header.find(R"("zeta":{"data_offsets":[3,11],"dtype":"I32","shape":[2]})"), std::string::npos);
  EXPECT_EQ(b.size(), 8 + n + 11);
  EXPECT_EQ(b[8 + n], 7);
  EXPECT_EQ(b[8 + n + 3], 1);
}

TEST(SafetensorsRoundTrip, EmptyFileAndScalar) {
  SafetensorsFile empty;
  const SafetensorsFile e2 = parse_bytes(empty.serialize());
  EXPECT_TRUE(e2.names().empty());
  EXPECT_TRUE(e2.metadata().empty());

  SafetensorsFile f;
  f.add(TensorRecord::from_values<float>("s", {}, {2.5f}));
  const SafetensorsFile g = parse_bytes(f.serialize());
  EXPECT_EQ(g.tensor("s").numel(), 1);
  EXPECT_EQ(g.tensor("s").data<float>()[0], 2.5f);
}

TEST(SafetensorsRoundTrip, WriterMatchesTheCorpusGenerator) {
  // make_corpus.py writes the c1 copies with its own (Python) implementation
  // of the same layout; our writer must produce byte-identical files.
  for (const char* name : {"c1_missing_kind", "c1_unknown_kind", "c1_zero_block_size",
                           "c1_missing_tensor_physical", "c1_physical_i16"}) {
    const std::string path = malformed_dir() + "/" + name + ".safetensors";
    EXPECT_TRUE(SafetensorsFile::read(path).serialize() == slurp(path)) << path;
  }
}

TEST(SafetensorsRoundTrip, WriteErrorsNameThePath) {
  SafetensorsFile f;
  const std::string path = "/nonexistent-dir-sparse-mla/x.safetensors";
  const std::string msg = error_of([&] { f.write(path); });
  EXPECT_EQ(msg.rfind(path + ": cannot open", 0), 0u) << msg;
}

// ---------------------------------------------------------------- golden files

TEST(SafetensorsGolden, ReadsEveryShippedFile) {
  const std::set<std::string> kinds = {"topk_convert", "topk_convert_dcp", "fp8_gather_upconvert", "hisparse_sequence",
                                       "v4_dequant_gather"};
  for (const std::string& stem : kGoldenStems) {
    SCOPED_TRACE(stem);
    const std::string path = golden(stem);
    ASSERT_TRUE(fs::exists(path)) << "golden file missing: " << path
                                  << " (set SPARSE_MLA_GOLDEN_DIR)";
    const SafetensorsFile f = SafetensorsFile::read(path);
    EXPECT_FALSE(f.names().empty());
    EXPECT_EQ(kinds.count(f.meta("kind")), 1u);
    EXPECT_EQ(f.meta("peer_repo"), "vllm-project/vllm");
    EXPECT_EQ(f.meta_int(f.has_meta("reference_mismatches") ? "reference_mismatches"
                                                            : "reference_model_mismatches"),
              0);
    // read() and parse() agree, and a rewrite reads back the same.
    const std::vector<std::uint8_t> bytes = slurp(path);
    expect_same(f, SafetensorsFile::parse(bytes.data(), bytes.size(), stem));
    expect_same(f, parse_bytes(f.serialize()));
  }
}

TEST(SafetensorsGolden, C1ConvertTinyEdges) {
  const SafetensorsFile f = SafetensorsFile::read(golden("c1_convert_tiny_edges"));
  EXPECT_EQ(f.meta("kind"), "topk_convert");
  const std::int64_t T = f.meta_int("num_tokens"), K = f.meta_int("num_topk");
  EXPECT_EQ(T, 7);
  EXPECT_EQ(K, 128);
  EXPECT_EQ(f.meta_int("block_size"), 64);
  EXPECT_EQ(f.meta_int("block_stride_rows"), 64);
  EXPECT_EQ(f.meta_int("num_requests"), 3);
  EXPECT_EQ(f.meta_int("max_num_blocks_per_req"), 4);
  EXPECT_EQ(f.meta_int("block_n"), 128);
  EXPECT_TRUE(f.meta_bool("return_valid_counts"));
  EXPECT_FALSE(f.meta_bool("has_prefill_workspace"));
  EXPECT_EQ(f.meta("count_path"), "single_tile");
  f.require("req_id", DType::i32, {T});
  f.require("block_table", DType::i32, {3, 4});
  f.require("logical", DType::i32, {T, K});
  const TensorRecord& phys = f.require_rank("physical", DType::i32, 2);
  EXPECT_EQ(phys.shape, (std::vector<std::int64_t>{7, 128}));
  const TensorRecord& vc = f.require("valid_counts", DType::i32, {T});
  // valid_counts[t] = entries of row t that are not -1.
  for (std::int64_t t = 0; t < T; ++t) {
    std::int64_t valid = 0;
    for (std::int64_t j = 0; j < K; ++j) valid += i32_at(phys, static_cast<std::size_t>(t * K + j)) != -1;
    EXPECT_EQ(i32_at(vc, static_cast<std::size_t>(t)), valid) << "row " << t;
  }
  // The README: an all -1 row exists, and block ids 0 and 11 appear in the table.
  bool all_invalid_row = false;
  for (std::int64_t t = 0; t < T; ++t) all_invalid_row |= i32_at(vc, static_cast<std::size_t>(t)) == 0;
  EXPECT_TRUE(all_invalid_row);
  const TensorRecord& bt = f.tensor("block_table");
  const std::int32_t* b = bt.data<std::int32_t>();
  EXPECT_NE(std::find(b, b + 12, 0), b + 12);
  EXPECT_NE(std::find(b, b + 12, 11), b + 12);
}

TEST(SafetensorsGolden, C3AndC5Convert) {
  const SafetensorsFile c3 = SafetensorsFile::read(golden("c3_convert_tiled_k384_bs16"));
  EXPECT_EQ(c3.meta_int("num_tokens"), 33);
  EXPECT_EQ(c3.meta_int("num_topk"), 384);
  EXPECT_EQ(c3.meta_int("block_size"), 16);
  c3.require("block_table", DType::i32, {5, 40});
  c3.require("physical", DType::i32, {33, 384});
  EXPECT_EQ(c3.meta("count_path").rfind("tiled_atomic_3x", 0), 0u) << c3.meta("count_path");

  const SafetensorsFile c5 = SafetensorsFile::read(golden("c5_convert_bs1"));
  EXPECT_EQ(c5.meta_int("num_tokens"), 5);
  EXPECT_EQ(c5.meta_int("num_topk"), 256);
  EXPECT_EQ(c5.meta_int("block_size"), 1);
  EXPECT_EQ(c5.meta_int("block_stride_rows"), 1);
  c5.require("block_table", DType::i32, {2, 300});
  c5.require("logical", DType::i32, {5, 256});
}

TEST(SafetensorsGolden, UpconvertFiles) {
  const SafetensorsFile u1 = SafetensorsFile::read(golden("u1_upconvert_small"));
  EXPECT_EQ(u1.meta("kind"), "fp8_gather_upconvert");
  EXPECT_EQ(u1.meta_int_list("seq_lens"), (std::vector<std::int64_t>{1, 65, 200}));
  EXPECT_EQ(u1.meta_int("block_size"), 64);
  EXPECT_EQ(u1.meta_int("num_blocks"), 12);
  EXPECT_EQ(u1.meta_int("total_tokens"), 266);
  EXPECT_EQ(u1.meta_int("entry_bytes"), 656);
  EXPECT_EQ(u1.meta_int("head_dim"), 576);
  EXPECT_FALSE(u1.meta_bool("has_seq_starts"));
  EXPECT_FALSE(u1.has("seq_starts"));
  u1.require("src_cache", DType::u8, {12, 64, 656});
  const TensorRecord& dst = u1.require("dst", DType::bf16, {266, 576});
  EXPECT_NE(dst.data<std::uint16_t>(), nullptr);  // BF16 read as raw bits
  const std::string msg = error_of([&] { dst.data<std::int32_t>(); });
  EXPECT_NE(msg.find("tensor 'dst': is BF16, read as I32"), std::string::npos) << msg;

  const SafetensorsFile u3 = SafetensorsFile::read(golden("u3_upconvert_seq_starts"));
  EXPECT_TRUE(u3.meta_bool("has_seq_starts"));
  EXPECT_EQ(u3.meta_int_list("seq_lens"), (std::vector<std::int64_t>{70, 3, 100, 64}));
  const std::vector<std::int64_t> starts = u3.meta_int_list("seq_starts");
  EXPECT_EQ(starts, (std::vector<std::int64_t>{0, 5, 64, 130}));
  const TensorRecord& ss = u3.require("seq_starts", DType::i32, {4});
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(i32_at(ss, i), starts[i]);
  u3.require("dst", DType::bf16, {237, 576});

  const SafetensorsFile u4 = SafetensorsFile::read(golden("u4_upconvert_bs1"));
  EXPECT_EQ(u4.meta_int("block_size"), 1);
  EXPECT_EQ(u4.meta_int("num_blocks"), 63);
  EXPECT_EQ(u4.meta_int_list("seq_lens"), (std::vector<std::int64_t>{1, 17, 40}));
  u4.require("src_cache", DType::u8, {63, 1, 656});
  u4.require("dst", DType::bf16, {58, 576});
}

TEST(SafetensorsGolden, H1HisparseSequence) {
  const SafetensorsFile h1 = SafetensorsFile::read(golden("h1_hisparse_6steps"));
  EXPECT_EQ(h1.meta("kind"), "hisparse_sequence");
  EXPECT_EQ(h1.meta_int("top_k"), 64);
  EXPECT_EQ(h1.meta_int("hot_size"), 128);
  EXPECT_EQ(h1.meta_int("num_steps"), 6);
  EXPECT_EQ(h1.meta_int("host_rows"), 4352);
  h1.require("host_cache", DType::u8, {4352, 656});
  h1.require("source_block_table", DType::i32, {4, 18});
  h1.require("initial.hot_cache", DType::u8, {9, 64, 656});
  const TensorRecord& lru = h1.require("initial.lru_slots", DType::i16, {4, 128});
  const std::int16_t* l = lru.data<std::int16_t>();
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 128; ++s) ASSERT_EQ(l[r * 128 + s], s);
  for (int s = 0; s < 6; ++s) {
    const std::string p = "step" + std::to_string(s) + ".";
    h1.require(p + "logical", DType::i32, {4, 64});
    h1.require(p + "swap_counts", DType::i32, {4});
    h1.require(p + "lru_slots", DType::i16, {4, 128});
    h1.require(p + "hot_cache", DType::u8, {9, 64, 656});
  }
  EXPECT_FALSE(h1.has("step6.logical"));
  // A list of lists is not an int list.
  const std::string msg = error_of([&] { h1.meta_int_list("step_states"); });
  EXPECT_NE(msg.find("'step_states'"), std::string::npos) << msg;
}

// ---------------------------------------------------------------- malformed corpus

namespace {
struct CorpusEntry {
  std::string file, check, expect;
};
std::vector<CorpusEntry> corpus() {
  std::ifstream in(malformed_dir() + "/expected_errors.tsv");
  std::vector<CorpusEntry> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    CorpusEntry e;
    std::getline(fields, e.file, '\t');
    std::getline(fields, e.check, '\t');
    std::getline(fields, e.expect);
    out.push_back(e);
  }
  return out;
}
}  // namespace

TEST(SafetensorsMalformed, ManifestListsEveryCorpusFile) {
  const std::vector<CorpusEntry> entries = corpus();
  ASSERT_GE(entries.size(), 30u) << "manifest " << malformed_dir() << "/expected_errors.tsv";
  std::set<std::string> listed;
  for (const auto& e : entries) {
    listed.insert(e.file);
    EXPECT_TRUE(e.check == "parse" || e.check == "content") << e.file;
    EXPECT_FALSE(e.expect.empty()) << e.file;
  }
  std::set<std::string> on_disk;
  for (const auto& de : fs::directory_iterator(malformed_dir())) {
    if (de.path().extension() == ".safetensors") on_disk.insert(de.path().filename().string());
  }
  EXPECT_EQ(listed, on_disk);
  // The cases the corpus must cover.
  for (const char* must :
       {"truncated_under_8_bytes", "header_length_past_end", "header_not_json", "header_not_object",
        "offsets_reversed", "offsets_past_end", "shape_bytes_mismatch", "unknown_dtype",
        "shape_product_overflow", "negative_dimension", "header_not_utf8",
        "metadata_not_string_values"}) {
    EXPECT_EQ(listed.count(std::string(must) + ".safetensors"), 1u) << must;
  }
}

TEST(SafetensorsMalformed, EveryParseCaseIsRejectedWithItsMessage) {
  int checked = 0;
  for (const auto& e : corpus()) {
    if (e.check != "parse") continue;
    SCOPED_TRACE(e.file);
    const std::string path = malformed_dir() + "/" + e.file;
    const std::string msg = error_of([&] { SafetensorsFile::read(path); });
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << "message must start with the path: " << msg;
    EXPECT_NE(msg.find(e.expect), std::string::npos) << "message: " << msg << "\nexpected: " << e.expect;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    // parse() from memory says the same, with its own origin.
    const std::vector<std::uint8_t> bytes = slurp(path);
    const std::string mem = error_of([&] { SafetensorsFile::parse(bytes.data(), bytes.size(), "ORIGIN"); });
    EXPECT_EQ(mem, "ORIGIN" + msg.substr(path.size())) << mem;
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

TEST(SafetensorsMalformed, ContentCasesParseButFailTheirRoleChecks) {
  const std::string d = malformed_dir() + "/";
  const SafetensorsFile c1 = SafetensorsFile::read(golden("c1_convert_tiny_edges"));

  const SafetensorsFile missing = SafetensorsFile::read(d + "c1_missing_tensor_physical.safetensors");
  std::string msg = error_of([&] { missing.require_rank("physical", DType::i32, 2); });
  EXPECT_EQ(msg, d + "c1_missing_tensor_physical.safetensors: missing tensor 'physical'");

  const SafetensorsFile nokind = SafetensorsFile::read(d + "c1_missing_kind.safetensors");
  msg = error_of([&] { nokind.meta("kind"); });
  EXPECT_EQ(msg, d + "c1_missing_kind.safetensors: missing metadata key 'kind'");
  EXPECT_EQ(nokind.names(), c1.names());

  EXPECT_EQ(SafetensorsFile::read(d + "c1_unknown_kind.safetensors").meta("kind"), "bogus");
  EXPECT_EQ(SafetensorsFile::read(d + "c1_zero_block_size.safetensors").meta_int("block_size"), 0);

  const SafetensorsFile i16 = SafetensorsFile::read(d + "c1_physical_i16.safetensors");
  msg = error_of([&] { i16.require("physical", DType::i32, {7, 128}); });
  EXPECT_NE(msg.find("tensor 'physical' is I16, expected I32"), std::string::npos) << msg;
  // Everything else is c1 unchanged.
  for (const std::string& n : c1.names()) {
    if (n != "physical") {
      EXPECT_TRUE(i16.tensor(n).bytes == c1.tensor(n).bytes) << n;
    }
  }
}

// ---------------------------------------------------------------- robustness

TEST(SafetensorsRobustness, TruncatedGoldenFilesAreAlwaysRejected) {
  TempDir tmp;
  for (const std::string& stem : kGoldenStems) {
    SCOPED_TRACE(stem);
    const std::vector<std::uint8_t> full = slurp(golden(stem));
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | full[static_cast<std::size_t>(i)];
    std::set<std::size_t> cuts;
    // Every offset through the length field, the header and the first data
    // bytes (every 7th in the large h1 header), plus 300 spread over the file.
    const std::size_t dense = std::min<std::size_t>(full.size(), 8 + n + 64);
    const std::size_t step = stem[0] == 'h' ? 7 : 1;
    for (std::size_t c = 0; c < dense; c += (c < 64 ? 1 : step)) cuts.insert(c);
    for (int i = 0; i < 300; ++i) cuts.insert(full.size() * static_cast<std::size_t>(i) / 300);
    cuts.insert(full.size() - 1);
    for (std::size_t cut : cuts) {
      if (cut >= full.size()) continue;
      const std::string msg =
          error_of([&] { SafetensorsFile::parse(full.data(), cut, "cut@" + std::to_string(cut)); });
      ASSERT_EQ(msg.rfind("cut@" + std::to_string(cut) + ": ", 0), 0u) << msg;
    }
    // The file path, too, at a few cuts.
    for (std::size_t cut : {std::size_t{0}, std::size_t{7}, std::size_t{8 + n / 2},
                            static_cast<std::size_t>(8 + n), full.size() - 1}) {
      const std::string path = tmp.file(stem + "_cut.safetensors");
      spit(path, std::vector<std::uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut)));
      const std::string msg = error_of([&] { SafetensorsFile::read(path); });
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
    }
  }
}

TEST(SafetensorsRobustness, RandomHeaderMutationsNeverCrash) {
  const std::vector<std::uint8_t> full = slurp(golden("c1_convert_tiny_edges"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | full[static_cast<std::size_t>(i)];
  std::mt19937_64 rng(7);
  const char interesting[] = "{}[]\",:-0123456789eE.\\ \xff\xc3\x80tfn";
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::uint8_t> b = full;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const std::size_t at = static_cast<std::size_t>(rng() % (8 + n));  // length field or header
      b[at] = (rng() % 2) ? static_cast<std::uint8_t>(rng())
                          : static_cast<std::uint8_t>(interesting[rng() % (sizeof(interesting) - 1)]);
    }
    try {
      const SafetensorsFile f = parse_bytes(b);
      ++accepted;
      for (const std::string& name : f.names()) EXPECT_EQ(f.tensor(name).bytes.size(), f.tensor(name).byte_size());
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(accepted, 0);  // some edits (e.g. inside metadata text) keep the file valid
}

TEST(SafetensorsRobustness, SmallHandWrittenHeaders) {
  const std::vector<std::uint8_t> d16(16, 0);
  // Accepted: zero-size tensors, scalars, trailing spaces, metadata only.
  EXPECT_NO_THROW(parse_bytes(image(R"({"x":{"dtype":"I32","shape":[0,5],"data_offsets":[0,0]}})")));
  EXPECT_NO_THROW(parse_bytes(image(R"({"x":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}   )",
                                    std::vector<std::uint8_t>(8, 1))));
  EXPECT_NO_THROW(parse_bytes(image(R"({"__metadata__":{}})")));
  EXPECT_EQ(parse_bytes(image(R"({"x":{"dtype":"U8","shape":[-0],"data_offsets":[-0,0]}})")).tensor("x").numel(), 0);
  EXPECT_NO_THROW(parse_bytes(image(
      R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})",
      d16)));
  // A zero-size tensor inside another one overlaps it.
  std::string msg = error_of([&] {
    parse_bytes(image(
        R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},"b":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})",
        d16));
  });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  // Names with control characters are escaped: messages stay on one line.
  msg = error_of([&] {
    parse_bytes(image(R"({"bad\nname":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}})", d16));
  });
  EXPECT_NE(msg.find("tensor 'bad\\x0aname': unknown dtype 'F16'"), std::string::npos) << msg;
  // A huge dimension beyond uint64 is not an integer; 1e3 neither.
  msg = error_of([&] {
    parse_bytes(image(R"({"x":{"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,16]}})", d16));
  });
  EXPECT_NE(msg.find("is not an integer"), std::string::npos) << msg;
  msg = error_of([&] { parse_bytes(image(R"({"x":{"dtype":"U8","shape":[1e1],"data_offsets":[0,16]}})", d16)); });
  EXPECT_NE(msg.find("is not an integer"), std::string::npos) << msg;
  msg = error_of([&] {
    parse_bytes(image(R"({"x":{"dtype":"U8","shape":[16],"data_offsets":[0,9223372036854775808]}})", d16));
  });
  EXPECT_NE(msg.find("overflows int64"), std::string::npos) << msg;
  // Lone surrogate escapes are not valid JSON strings.
  msg = error_of([&] { parse_bytes(image(R"({"__metadata__":{"k":"\ud800"}})")); });
  EXPECT_NE(msg.find("header is not JSON"), std::string::npos) << msg;
  // Trailing garbage after the object is not JSON.
  msg = error_of([&] { parse_bytes(image(R"({} x)")); });
  EXPECT_NE(msg.find("header is not JSON"), std::string::npos) << msg;
  // NUL padding is not whitespace (nlohmann alone would stop reading there).
  msg = error_of([&] { parse_bytes(image(std::string("{}\0\0", 4))); });
  EXPECT_EQ(msg, "mem: header contains a NUL byte at header offset 2");
  msg = error_of([&] { parse_bytes(image(std::string("{}\0 x", 4))); });
  EXPECT_EQ(msg, "mem: header contains a NUL byte at header offset 2");
  // Null pointer and empty input.
  msg = error_of([&] { SafetensorsFile::parse(nullptr, 0, "nil"); });
  EXPECT_EQ(msg, "nil: file is 0 bytes, shorter than the 8-byte header length field");
}

TEST(SafetensorsRobustness, ReadErrorsNameThePath) {
  std::string msg = error_of([] { SafetensorsFile::read("/nonexistent/sparse-mla.safetensors"); });
  EXPECT_EQ(msg.rfind("/nonexistent/sparse-mla.safetensors: cannot open", 0), 0u) << msg;
  TempDir tmp;
  msg = error_of([&] { SafetensorsFile::read(tmp.path.string()); });
  EXPECT_EQ(msg, tmp.path.string() + ": cannot open: not a regular file");
}

// ---------------------------------------------------------------- accessors

TEST(SafetensorsAccess, TensorAndRoleChecks) {
  SafetensorsFile f("case.safetensors");
  f.add(TensorRecord::from_values<std::int32_t>("logical", {2, 3}, {1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.tensor("logical").numel(), 6);
  EXPECT_EQ(f.tensor("logical").data<std::int32_t>()[5], 6);
  EXPECT_EQ(&f.require_rank("logical", DType::i32, 2), &f.tensor("logical"));
  EXPECT_NO_THROW(f.require("logical", DType::i32, {2, 3}));
  EXPECT_NO_THROW(f.require("logical", DType::i32, {-1, 3}));
  EXPECT_EQ(error_of([&] { f.tensor("x"); }), "case.safetensors: missing tensor 'x'");
  EXPECT_EQ(error_of([&] { f.require_rank("logical", DType::i16, 2); }),
            "case.safetensors: tensor 'logical' is I32, expected I16");
  EXPECT_EQ(error_of([&] { f.require_rank("logical", DType::i32, 3); }),
            "case.safetensors: tensor 'logical' has shape [2, 3] (rank 2), expected rank 3");
  EXPECT_EQ(error_of([&] { f.require("logical", DType::i32, {-1, 4}); }),
            "case.safetensors: tensor 'logical' has shape [2, 3], expected [*, 4]");
  EXPECT_EQ(error_of([&] { f.require("logical", DType::i32, {2}); }),
            "case.safetensors: tensor 'logical' has shape [2, 3], expected [2]");
  EXPECT_EQ(error_of([&] { f.tensor("logical").data<std::int16_t>(); }),
            "tensor 'logical': is I32, read as I16");
}

TEST(SafetensorsAccess, AddRejectsBadRecords) {
  SafetensorsFile f("o");
  f.add(TensorRecord::from_values<std::uint8_t>("a", {1}, {1}));
  EXPECT_NE(error_of([&] { f.add(TensorRecord::from_values<std::uint8_t>("a", {1}, {1})); }).find("already present"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.add(TensorRecord::from_values<std::uint8_t>("", {1}, {1})); }).find("empty name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.add(TensorRecord::from_values<std::uint8_t>("__metadata__", {1}, {1})); })
                .find("'__metadata__'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.add(TensorRecord::from_values<std::uint8_t>("\xff", {1}, {1})); }).find("UTF-8"),
            std::string::npos);
  TensorRecord wrong;
  wrong.name = "w";
  wrong.dtype = DType::i32;
  wrong.shape = {3};
  wrong.bytes.resize(11);
  EXPECT_EQ(error_of([&] { f.add(wrong); }), "o: cannot add tensor 'w': 11 bytes but shape [3] of I32 needs 12");
  EXPECT_NE(error_of([&] { wrong.data<std::int32_t>(); }).find("holds 11 bytes"), std::string::npos);
  wrong.shape = {-3};
  EXPECT_NE(error_of([&] { f.add(wrong); }).find("negative dim"), std::string::npos);
  EXPECT_NE(error_of([&] { wrong.numel(); }).find("negative dim"), std::string::npos);
  wrong.shape = {INT64_MAX / 2, 3};
  EXPECT_NE(error_of([&] { f.add(wrong); }).find("overflows int64"), std::string::npos);
  wrong.shape = {INT64_MAX / 2};
  EXPECT_NE(error_of([&] { wrong.byte_size(); }).find("overflows"), std::string::npos);
  EXPECT_NE(error_of([] { TensorRecord::from_values<std::int32_t>("v", {2, 2}, {1, 2, 3}); }).find("needs 4 values, got 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { f.set_meta("k", "\xc0\x80"); }).find("not valid UTF-8"), std::string::npos);
  EXPECT_EQ(f.names(), std::vector<std::string>{"a"});
}

TEST(SafetensorsAccess, MetadataHelpers) {
  SafetensorsFile f("m.safetensors");
  const std::vector<std::pair<std::string, std::int64_t>> good_ints = {
      {"64", 64}, {"0", 0}, {"-1", -1}, {"-0", 0},
      {"9223372036854775807", INT64_MAX}, {"-9223372036854775808", INT64_MIN}};
  for (const auto& [text, value] : good_ints) {
    f.set_meta("k", text);
    EXPECT_EQ(f.meta_int("k"), value) << text;
  }
  for (const char* bad : {"", "-", "+1", "01", " 64", "64 ", "1.0", "1e3", "0x10", "true",
                          "9223372036854775808", "-9223372036854775809", "[64]"}) {
    f.set_meta("block_size", bad);
    EXPECT_EQ(error_of([&] { f.meta_int("block_size"); }),
              std::string("m.safetensors: metadata 'block_size' = '") + bad + "' is not an integer (int64)");
  }
  f.set_meta("b", "true");
  EXPECT_TRUE(f.meta_bool("b"));
  f.set_meta("b", "false");
  EXPECT_FALSE(f.meta_bool("b"));
  for (const char* bad : {"True", "FALSE", "1", "0", "", " true", "yes"}) {
    f.set_meta("b", bad);
    EXPECT_NE(error_of([&] { f.meta_bool("b"); }).find("is not a boolean"), std::string::npos) << bad;
  }
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> good_lists = {
      {"[1, 65, 200]", {1, 65, 200}}, {"[]", {}}, {" [ -1 ,0 ] ", {-1, 0}},
      {"[9223372036854775807]", {INT64_MAX}}};
  for (const auto& [text, value] : good_lists) {
    f.set_meta("l", text);
    EXPECT_EQ(f.meta_int_list("l"), value) << text;
  }
  for (const char* bad : {"", "1", "[1,", "[1.5]", "[[1]]", "[\"1\"]", "[true]", "{}",
                          "[9223372036854775808]", "[1] [2]", "[1]x"}) {
    f.set_meta("seq_lens", bad);
    const std::string msg = error_of([&] { f.meta_int_list("seq_lens"); });
    EXPECT_EQ(msg.rfind(std::string("m.safetensors: metadata 'seq_lens' = '") + bad + "' is not a list of integers",
                        0),
              0u)
        << msg;
  }
  f.set_meta("seq_lens", std::string("[1]\0[2]", 7));
  EXPECT_NE(error_of([&] { f.meta_int_list("seq_lens"); }).find("contains a NUL byte"), std::string::npos);
  EXPECT_EQ(error_of([&] { f.meta("nope"); }), "m.safetensors: missing metadata key 'nope'");
  EXPECT_EQ(error_of([&] { f.meta_int("nope"); }), "m.safetensors: missing metadata key 'nope'");
  EXPECT_TRUE(f.has_meta("b"));
  EXPECT_FALSE(f.has_meta("nope"));
}
