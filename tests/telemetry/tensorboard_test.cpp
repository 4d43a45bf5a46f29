// TensorBoard event files and CSV export. The event files gradguard writes are read back by
// tests/telemetry/read_tfevents.py, an independent standard-library reader that checks both
// masked CRC-32Cs of every record and decodes the protobuf generically; every expected
// tag, step, value (as float32) and wall time is compared, and a flipped byte must make
// the reader fail, so the check is shown able to fail.
#include "gradguard/telemetry/tensorboard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "gradguard/apps/csv_export.h"
#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "test_util.h"

namespace gradguard {
namespace {
using ::testing::HasSubstr;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// One line of each kind: nulls (NaN in the trainer), a string telemetry field with a
// comma and quotes, a rank, an odd layer name, and a final validation at a step that has
// no step line.
const char* kFixture =
    R"({"step":0,"val_loss":5.5}
{"step":0,"loss":5.25,"lr":0.00015,"grad_norm":6.5,"clip_coef":0.15,"clip_threshold":1.0,"loss_scale":1.0,"skipped":false,"tokens":8192,"tokens_per_s":3852.07,"elapsed_s":2.0,"noise_scale":3.05,"layer_grad_norms":{"embed_tokens":1.77,"layers.0":3.99,"norm":null,"odd,\"layer\"":0.5}}
{"step":0,"event":"telemetry","t_s":0.5,"unix_time":1700000001.5,"cpu_percent":76.8,"rss_mb":176.25,"threads":4,"load1":null,"gpu_count":1,"gpu0_name":"NVIDIA H100, \"SXM\"","gpu0_temperature_c":41.0}
{"step":1,"event":"anomaly","kind":"loss_spike","severity":"critical","loss":12.5,"expected":2.5,"std":null,"zscore":22.75,"layers":["norm"],"message":"loss 12.5, spike"}
{"step":1,"event":"recovery","action":"skip","rung":0,"budget_left":19,"anomaly":"loss_spike","snapshot":null}
{"step":1,"loss":null,"lr":0.0003,"grad_norm":null,"clip_coef":null,"clip_threshold":null,"loss_scale":0.5,"skipped":true,"tokens":8192,"tokens_per_s":4000.5,"elapsed_s":3.5,"layer_grad_norms":{"embed_tokens":null,"layers.0":2.5,"norm":0.03}}
{"step":1,"event":"telemetry","rank":1,"t_s":2.0,"unix_time":1700000003.0,"cpu_percent":90.5,"gpu_count":0}
{"step":2,"event":"warning","kind":"noise_scale","noise_scale":11.8,"global_batch":128}
{"step":2,"val_loss":2.625}
)";

struct Expected {
  std::string tag;
  int64_t step;
  double value;
  double wall_time;
};

// Run start: the telemetry line after step 0 (elapsed 2.0) has unix_time 1700000001.5, so
// start >= 1699999999.5 (the rank-1 line does not count).
constexpr double kStart = 1699999999.5;
constexpr double kStep0 = kStart + 2.0;
constexpr double kStep1 = kStart + 3.5;

std::vector<Expected> expected_scalars() {
  return {
      {"val/loss", 0, 5.5, kStart},
      {"train/loss", 0, 5.25, kStep0},
      {"train/lr", 0, 0.00015, kStep0},
      {"train/grad_norm", 0, 6.5, kStep0},
      {"train/clip_coef", 0, 0.15, kStep0},
      {"train/clip_threshold", 0, 1.0, kStep0},
      {"train/loss_scale", 0, 1.0, kStep0},
      {"train/skipped", 0, 0.0, kStep0},
      {"train/tokens", 0, 8192, kStep0},
      {"train/tokens_per_s", 0, 3852.07, kStep0},
      {"train/elapsed_s", 0, 2.0, kStep0},
      {"train/noise_scale", 0, 3.05, kStep0},
      {"layer_grad_norm/embed_tokens", 0, 1.77, kStep0},
      {"layer_grad_norm/layers.0", 0, 3.99, kStep0},
      {"layer_grad_norm/odd,\"layer\"", 0, 0.5, kStep0},
      {"telemetry/t_s", 0, 0.5, 1700000001.5},
      {"telemetry/cpu_percent", 0, 76.8, 1700000001.5},
      {"telemetry/rss_mb", 0, 176.25, 1700000001.5},
      {"telemetry/threads", 0, 4, 1700000001.5},
      {"telemetry/gpu_count", 0, 1, 1700000001.5},
      {"telemetry/gpu0_temperature_c", 0, 41.0, 1700000001.5},
      {"guard/anomaly", 1, 1.0, kStep0},
      {"guard/anomaly/loss_spike/loss", 1, 12.5, kStep0},
      {"guard/anomaly/loss_spike/expected", 1, 2.5, kStep0},
      {"guard/anomaly/loss_spike/zscore", 1, 22.75, kStep0},
      {"guard/recovery/skip", 1, 0.0, kStep0},
      {"guard/recovery/budget_left", 1, 19, kStep0},
      {"train/lr", 1, 0.0003, kStep1},
      {"train/loss_scale", 1, 0.5, kStep1},
      {"train/skipped", 1, 1.0, kStep1},
      {"train/tokens", 1, 8192, kStep1},
      {"train/tokens_per_s", 1, 4000.5, kStep1},
      {"train/elapsed_s", 1, 3.5, kStep1},
      {"layer_grad_norm/layers.0", 1, 2.5, kStep1},
      {"layer_grad_norm/norm", 1, 0.03, kStep1},
      {"telemetry/rank1/t_s", 1, 2.0, 1700000003.0},
      {"telemetry/rank1/cpu_percent", 1, 90.5, 1700000003.0},
      {"telemetry/rank1/gpu_count", 1, 0, 1700000003.0},
      {"warning/noise_scale", 2, 11.8, kStep1},
      {"warning/global_batch", 2, 128, kStep1},
      {"val/loss", 2, 2.625, kStep1},
  };
}

struct ReaderResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs the independent Python reader on `args`.
ReaderResult run_reader(const std::string& args) {
  const std::string command = "/usr/bin/python3 '" +
                              test::source_path("tests/telemetry/read_tfevents.py") + "' " + args +
                              " 2>&1";
  ReaderResult r;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Json read_events(const std::string& path) {
  const ReaderResult r = run_reader("'" + path + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? Json::parse(r.output) : Json();
}

// The only event file in `dir`.
std::string event_file_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().find("tfevents") != std::string::npos)
      found.push_back(entry.path());
  EXPECT_EQ(found.size(), 1u);
  return found.empty() ? "" : found.front();
}

TEST(TensorBoard, ReaderSelfTest) {
  const ReaderResult r = run_reader("--self-test");  // CRC-32C("123456789") == 0xE3069283, ...
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(TensorBoard, ConvertedFileReadsBackWithEveryTagStepValueAndWallTime) {
  test::TempDir dir;
  test::write_text(dir.file("metrics.jsonl"), kFixture);
  const std::vector<Expected> expected = expected_scalars();
  EXPECT_EQ(telemetry::write_tensorboard(dir.file("metrics.jsonl"), dir.file("tb")),
            static_cast<int64_t>(expected.size()));

  const std::string path = event_file_in(dir.file("tb"));
  EXPECT_THAT(std::filesystem::path(path).filename().string(),
              ::testing::StartsWith("events.out.tfevents."));
  const Json events = read_events(path);
  ASSERT_TRUE(events.is_object());
  EXPECT_EQ(events["file_version"], "brain.Event:2");
  const Json& scalars = events["scalars"];
  ASSERT_EQ(scalars.size(), expected.size()) << scalars.dump(1);
  for (size_t i = 0; i < expected.size(); ++i) {
    const Expected& e = expected[i];
    SCOPED_TRACE(e.tag + " at step " + std::to_string(e.step));
    EXPECT_EQ(scalars[i]["tag"], e.tag);
    EXPECT_EQ(scalars[i]["step"], e.step);
    EXPECT_EQ(scalars[i]["value"].get<double>(), static_cast<double>(static_cast<float>(e.value)));
    EXPECT_DOUBLE_EQ(scalars[i]["wall_time"].get<double>(), e.wall_time);
  }
}

TEST(TensorBoard, FlippedByteOrTruncationFailsTheReader) {
  test::TempDir dir;
  test::write_text(dir.file("metrics.jsonl"), kFixture);
  telemetry::write_tensorboard(dir.file("metrics.jsonl"), dir.file("tb"));
  const std::string good = test::read_text(event_file_in(dir.file("tb")));
  ASSERT_GT(good.size(), 100u);
  // A length byte, the length CRC, a byte of the first and of a later record's data, and
  // the last data CRC.
  for (size_t at : {size_t{0}, size_t{9}, size_t{20}, good.size() / 2, good.size() - 1}) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    test::write_text(dir.file("bad"), bad);
    const ReaderResult r = run_reader("'" + dir.file("bad") + "'");
    EXPECT_EQ(r.exit_code, 1) << "flipped byte " << at << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("corrupt")) << "flipped byte " << at;
  }
  test::write_text(dir.file("short"), good.substr(0, good.size() - 1));
  EXPECT_EQ(run_reader("'" + dir.file("short") + "'").exit_code, 1);
}

TEST(TensorBoard, EventWriterScalarsAndLiveFlush) {
  test::TempDir dir;
  telemetry::EventWriterOptions options;
  options.exact_path = true;
  options.start_wall_time = 1.5;
  telemetry::EventWriter writer(dir.file("sub/events.out.tfevents.test"), options);
  // A step that needs a multi-byte varint; a value beyond float range (+inf).
  writer.add_scalar("big/step", int64_t{1} << 40, 1e39, 2.25);
  writer.add_scalar("neg", 7, -0.1, 3.0);
  const auto line =
      OrderedJson::parse(R"({"step":8,"loss":2.0,"skipped":true,"not_a_number":null})");
  EXPECT_EQ(writer.add_metrics_line(line, 4.0), 2);
  EXPECT_EQ(writer.scalars(), 4);
  // auto_flush: everything is readable before close().
  const Json events = read_events(writer.path());
  ASSERT_EQ(events["scalars"].size(), 4u);
  EXPECT_EQ(events["scalars"][0]["step"], int64_t{1} << 40);
  EXPECT_EQ(events["scalars"][0]["value"], "inf");
  EXPECT_EQ(events["scalars"][1]["value"].get<double>(), static_cast<double>(-0.1f));
  EXPECT_EQ(events["scalars"][3]["tag"], "train/skipped");
  EXPECT_EQ(events["scalars"][3]["wall_time"], 4.0);
  writer.close();
}

// A step line's records reach the OS on every line, so a live TensorBoard sees them; this
// measures that the per-line flush (one write(2), no fsync) stays cheap.
TEST(TensorBoard, FlushPerStepLineIsCheap) {
  test::TempDir dir;
  OrderedJson line = OrderedJson::parse(R"({"step":0,"loss":2.5,"lr":0.001,"grad_norm":1.5,
      "clip_coef":1.0,"clip_threshold":1.0,"loss_scale":65536.0,"skipped":false,"tokens":262144,
      "tokens_per_s":1.5e5,"elapsed_s":10.0,"noise_scale":300.0})");
  for (int l = 0; l < 32; ++l) line["layer_grad_norms"]["layers." + std::to_string(l)] = 0.25 + l;
  constexpr int kLines = 2000;
  double us_per_line[2] = {0, 0};  // [auto_flush]
  for (int flush = 0; flush < 2; ++flush) {
    telemetry::EventWriterOptions options;
    options.auto_flush = flush == 1;
    telemetry::EventWriter writer(dir.path(), options);
    const auto begin = std::chrono::steady_clock::now();
    for (int s = 0; s < kLines; ++s) {
      line["step"] = s;
      writer.add_metrics_line(line, 1e9 + s);
    }
    writer.flush();
    const auto end = std::chrono::steady_clock::now();
    us_per_line[flush] = std::chrono::duration<double, std::micro>(end - begin).count() / kLines;
    EXPECT_EQ(writer.scalars(), kLines * 43);
    writer.close();
  }
  std::printf("add_metrics_line, 43 scalars: %.1f us buffered, %.1f us with a flush per line\n",
              us_per_line[0], us_per_line[1]);
  EXPECT_LT(us_per_line[1], 2000.0);  // loose: a loaded CI machine must not fail this
}

TEST(TensorBoard, TwoFilesInOneDirectoryGetDistinctNames) {
  test::TempDir dir;
  telemetry::EventWriter a(dir.path());
  telemetry::EventWriter b(dir.path());
  EXPECT_NE(a.path(), b.path());
  EXPECT_THAT(a.path(), HasSubstr("." + std::to_string(::getpid())));
}

// A malformed line never stops a conversion (docs/reporting.md): it is left out and
// named with its file and line, whatever is wrong with it -- not JSON, not an object, no
// step, a field of the wrong type, nested a million levels deep.
TEST(TensorBoard, BadLinesAreLeftOutAndNamed) {
  test::TempDir dir;
  const std::string metrics = dir.file("metrics.jsonl");
  auto convert = [&](const std::string& text, std::vector<std::string>* skipped) {
    test::write_text(metrics, text);
    std::filesystem::remove_all(dir.file("tb"));
    return telemetry::write_tensorboard(metrics, dir.file("tb"), skipped);
  };
  std::vector<std::string> skipped;
  const int64_t good = convert("{\"step\":0,\"loss\":1.0}\n{\"step\":2,\"loss\":1.0}\n", &skipped);
  EXPECT_TRUE(skipped.empty());
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  for (const std::string& bad :
       {std::string("{\"step\":1,\"loss\":"), std::string("[1,2]"), std::string("{\"loss\":1.0}"),
        std::string("{\"step\":-3,\"event\":\"x\"}"), std::string("{\"step\":1,\"event\":7}"),
        std::string("{\"step\":null,\"loss\":1}"), deep, "{\"step\":1,\"loss\":" + deep + "}"}) {
    skipped.clear();
    EXPECT_EQ(convert("{\"step\":0,\"loss\":1.0}\n" + bad + "\n{\"step\":2,\"loss\":1.0}\n", &skipped), good)
        << excerpt(bad);
    ASSERT_EQ(skipped.size(), 1u) << excerpt(bad);
    EXPECT_THAT(skipped[0], HasSubstr(metrics + ":2")) << excerpt(bad);
    skipped.clear();
    test::write_text(metrics, "{\"step\":0,\"loss\":1.0}\n" + bad + "\n");
    const auto csv = report::write_csv(metrics, dir.file("csv"));
    EXPECT_EQ(csv.step_rows, 1) << excerpt(bad);
    ASSERT_EQ(csv.skipped.size(), 1u) << excerpt(bad);
    EXPECT_THAT(csv.skipped[0], HasSubstr(metrics + ":2"));
  }
  test::write_text(metrics, "{\"step\":1,\"event\":7}\n");
  EXPECT_THAT(report::write_csv(metrics, dir.file("csv")).skipped.at(0), HasSubstr("\"event\" must be a string"));

  // The half-written last line of a crashed run (no newline) is skipped silently.
  skipped.clear();
  EXPECT_EQ(convert("{\"step\":0,\"loss\":1.0}\n{\"step\":1,\"lo", &skipped), 1);
  EXPECT_TRUE(skipped.empty());
}

TEST(TensorBoard, MissingInputAndUnwritableOutput) {
  test::TempDir dir;
  const std::string missing = dir.file("none/metrics.jsonl");
  EXPECT_THAT(test::bad_input_message([&] { telemetry::write_tensorboard(missing, dir.file("tb")); }),
              HasSubstr(missing));
  EXPECT_THAT(test::bad_input_message([&] { report::write_csv(missing, dir.file("csv")); }),
              HasSubstr(missing));
  EXPECT_THAT(test::bad_input_message([&] { report::write_csv(dir.path(), dir.file("csv")); }),
              HasSubstr("is a directory"));

  // A directory below a regular file cannot be created, even by root.
  test::write_text(dir.file("metrics.jsonl"), kFixture);
  test::write_text(dir.file("file"), "x");
  const std::string blocked = dir.file("file/out");
  for (int which = 0; which < 3; ++which) {
    try {
      if (which == 0) telemetry::write_tensorboard(dir.file("metrics.jsonl"), blocked);
      if (which == 1) report::write_csv(dir.file("metrics.jsonl"), blocked);
      if (which == 2) telemetry::EventWriter(blocked + "/events.out.tfevents.x", {true});
      ADD_FAILURE() << "expected gradguard::Error (" << which << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRuntime) << e.what();
      EXPECT_THAT(e.what(), HasSubstr(blocked)) << which;
    }
  }
}

TEST(Csv, StepsAndTelemetryTables) {
  test::TempDir dir;
  test::write_text(dir.file("metrics.jsonl"), kFixture);
  const report::CsvExport out = report::write_csv(dir.file("metrics.jsonl"), dir.file("csv"));
  EXPECT_EQ(out.steps_path, dir.file("csv") + "/steps.csv");
  EXPECT_EQ(out.telemetry_path, dir.file("csv") + "/telemetry.csv");
  EXPECT_EQ(out.step_rows, 3);  // two step lines and the final validation's own row
  EXPECT_EQ(out.telemetry_rows, 2);
  EXPECT_EQ(
      test::read_text(out.steps_path),
      "step,loss,lr,grad_norm,clip_coef,clip_threshold,loss_scale,skipped,tokens,tokens_per_s,"
      "elapsed_s,"
      "noise_scale,layer_grad_norm/embed_tokens,layer_grad_norm/layers.0,layer_grad_norm/norm,"
      "\"layer_grad_norm/odd,\"\"layer\"\"\",val_loss\n"
      "0,5.25,0.00015,6.5,0.15,1.0,1.0,0,8192,3852.07,2.0,3.05,1.77,3.99,,0.5,5.5\n"
      "1,,0.0003,,,,0.5,1,8192,4000.5,3.5,,,2.5,0.03,,\n"
      "2,,,,,,,,,,,,,,,,2.625\n");
  EXPECT_EQ(test::read_text(out.telemetry_path),
            "step,t_s,unix_time,cpu_percent,rss_mb,threads,load1,gpu_count,gpu0_name,gpu0_"
            "temperature_c,rank\n"
            "0,0.5,1700000001.5,76.8,176.25,4,,1,\"NVIDIA H100, \"\"SXM\"\"\",41.0,\n"
            "1,2.0,1700000003.0,90.5,,,,0,,,1\n");
  // No temporary files left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.file("csv")), {}), 2);
}

TEST(Csv, FullPrecisionAndValidationOnItsStep) {
  test::TempDir dir;
  // 0.1 + 0.2 needs 17 digits; a validation written after the step line of its step (not
  // the trainer's order) still lands on that row; a repeated step (rollback) gets its own row.
  test::write_text(dir.file("metrics.jsonl"),
                   "{\"step\":0,\"loss\":0.30000000000000004,\"tokens\":9007199254740993}\n"
                   "{\"step\":1,\"loss\":1e-300}\n"
                   "{\"step\":1,\"val_loss\":null}\n"
                   "{\"step\":1,\"loss\":2.0}\n"
                   "{\"step\":0,\"val_loss\":4.0}\n");
  const report::CsvExport out = report::write_csv(dir.file("metrics.jsonl"), dir.path());
  EXPECT_EQ(test::read_text(out.steps_path),
            "step,loss,tokens,val_loss\n"
            "0,0.30000000000000004,9007199254740993,4.0\n"
            "1,1e-300,,\n"
            "1,2.0,,\n");
  EXPECT_EQ(test::read_text(out.telemetry_path), "step\n");
}

}  // namespace
}  // namespace gradguard
