// LossScaler: the dynamic trajectory against PyTorch (tests/golden/scaler.json, made by
// make_scaler_golden.py), then the extensions PyTorch lacks, checked by hand. The golden
// reference is torch 1.13's own CPU scale update,
// ShardedGradScaler._amp_update_scale_cpu_ (the same algorithm as the CUDA kernel behind
// GradScaler.update(); torch._amp_update_scale_ itself has no CPU kernel in 1.13).
#include "gradguard/amp/loss_scaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "golden_util.h"
#include "gradguard/amp/precision.h"
#include "gradguard/config/config.h"
#include "gradguard/core/choice.h"
#include "gradguard/core/error.h"

namespace gradguard::amp {
namespace {
using ::testing::HasSubstr;

LossScalerOptions small_options() {
  LossScalerOptions o;
  o.init_scale = 1024;
  o.growth_interval = 2;
  o.max_scale = 0;
  o.min_scale = 1.0 / 1024;
  return o;
}

// Runs `pattern` ('F' finite, 'I' overflow) and returns the updates.
std::vector<ScalerUpdate> run(LossScaler& s, const std::string& pattern) {
  std::vector<ScalerUpdate> out;
  for (char c : pattern) out.push_back(s.update(c == 'I'));
  return out;
}

TEST(LossScaler, MatchesPyTorchTrajectory) {
  auto golden = test::load_golden("scaler.json");
  ASSERT_GE(golden["cases"].size(), 4u);
  for (const auto& c : golden["cases"]) {
    LossScalerOptions o;
    o.init_scale = c["init_scale"];
    o.growth_factor = c["growth_factor"];
    o.backoff_factor = c["backoff_factor"];
    o.growth_interval = c["growth_interval"];
    o.hysteresis = 1;     // PyTorch: back off on every overflow
    o.max_scale = 0;      // no cap
    o.min_scale = 1e-30;  // no floor in reach
    LossScaler s(o, ScalerMode::kDynamic);
    const auto& steps = c["steps"];
    ASSERT_GE(steps.size(), 40u);
    int64_t skipped = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (i == steps.size() / 2) {  // resume mid-trajectory from a saved state
        LossScaler resumed(o, ScalerMode::kDynamic);
        resumed.load_state_dict(nlohmann::json::parse(s.state_dict().dump()));
        s = resumed;
      }
      const bool inf = steps[i]["found_inf"];
      const double before = s.scale();
      const auto u = s.update(inf);
      skipped += inf;
      const std::string where = c["name"].get<std::string>() + " step " + std::to_string(i);
      EXPECT_EQ(u.scale_used, before) << where;
      EXPECT_EQ(u.next_scale, s.scale()) << where;
      EXPECT_EQ(s.scale(), steps[i]["scale"].get<double>()) << where;  // exact
      EXPECT_EQ(s.growth_tracker(), steps[i]["growth_tracker"].get<int64_t>()) << where;
      EXPECT_EQ(u.skipped, inf) << where;
      EXPECT_EQ(u.backed_off, inf) << where;
      EXPECT_EQ(u.grew, u.next_scale > u.scale_used) << where;
      EXPECT_FALSE(u.stuck) << where;
    }
    EXPECT_EQ(s.skipped_steps(), skipped);
  }
}

TEST(LossScaler, DefaultsArePyTorchsAndScaleInverts) {
  LossScalerOptions o;
  EXPECT_EQ(o.init_scale, 65536.0);
  EXPECT_EQ(o.growth_factor, 2.0);
  EXPECT_EQ(o.backoff_factor, 0.5);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(o.hysteresis, 1);
  LossScaler s(o, ScalerMode::kDynamic);
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.inv_scale(), 1.0 / 65536.0);
}

TEST(LossScaler, GrowthCappedAtMaxScale) {
  auto o = small_options();
  o.max_scale = 3000;  // not a power of two: the cap itself is reached
  LossScaler s(o, ScalerMode::kDynamic);
  auto u = run(s, "FF");
  EXPECT_TRUE(u[1].grew);
  EXPECT_EQ(s.scale(), 2048);
  u = run(s, "FF");
  EXPECT_TRUE(u[1].grew);
  EXPECT_EQ(u[1].next_scale, 3000);
  u = run(s, "FFFF");  // at the cap: intervals complete but nothing grows
  EXPECT_FALSE(u[1].grew);
  EXPECT_FALSE(u[3].grew);
  EXPECT_EQ(s.scale(), 3000);
  EXPECT_EQ(s.growth_tracker(), 0);
  u = run(s, "I");
  EXPECT_TRUE(u[0].backed_off);
  EXPECT_EQ(s.scale(), 1500);
}

TEST(LossScaler, BackoffFlooredAtMinScaleAndStuckAfterPatience) {
  auto o = small_options();
  o.init_scale = 8;
  o.min_scale = 3;
  o.min_scale_patience = 3;
  LossScaler s(o, ScalerMode::kDynamic);
  auto u = run(s, "II");
  EXPECT_TRUE(u[0].backed_off);
  EXPECT_EQ(u[0].next_scale, 4);
  EXPECT_TRUE(u[1].backed_off);  // 4 -> max(2, 3) = 3
  EXPECT_EQ(u[1].next_scale, 3);
  EXPECT_FALSE(u[1].stuck);  // it was above the floor when it overflowed
  u = run(s, "IIII");        // overflows at the floor: 1, 2, 3 (stuck), 4 (still stuck)
  for (const auto& x : u) {
    EXPECT_TRUE(x.skipped);
    EXPECT_FALSE(x.backed_off);
    EXPECT_EQ(x.next_scale, 3);
  }
  EXPECT_FALSE(u[0].stuck);
  EXPECT_FALSE(u[1].stuck);
  EXPECT_TRUE(u[2].stuck);
  EXPECT_TRUE(u[3].stuck);
  // A finite step ends the streak; patience starts over.
  u = run(s, "FIII");
  EXPECT_FALSE(u[0].skipped);
  EXPECT_FALSE(u[1].stuck);
  EXPECT_FALSE(u[2].stuck);
  EXPECT_TRUE(u[3].stuck);
  EXPECT_EQ(s.skipped_steps(), 9);
}

TEST(LossScaler, HysteresisTwoDelaysBackoffButStillSkips) {
  auto o = small_options();
  o.hysteresis = 2;
  LossScaler s(o, ScalerMode::kDynamic);
  auto u = run(s, "I");
  EXPECT_TRUE(u[0].skipped);
  EXPECT_FALSE(u[0].backed_off);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.growth_tracker(), 0);
  u = run(s, "I");  // second in a row: back off, counter resets
  EXPECT_TRUE(u[0].backed_off);
  EXPECT_EQ(s.scale(), 512);
  u = run(s, "IFI");  // a finite step in between resets the counter: no backoff
  EXPECT_FALSE(u[0].backed_off);
  EXPECT_FALSE(u[2].backed_off);
  EXPECT_EQ(s.scale(), 512);
  u = run(s, "I");
  EXPECT_TRUE(u[0].backed_off);
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.skipped_steps(), 5);
}

TEST(LossScaler, HysteresisThree) {
  auto o = small_options();
  o.hysteresis = 3;
  LossScaler s(o, ScalerMode::kDynamic);
  auto u = run(s, "IIIIII");
  const std::vector<bool> backed{false, false, true, false, false, true};
  for (size_t i = 0; i < u.size(); ++i) {
    EXPECT_TRUE(u[i].skipped) << i;
    EXPECT_EQ(u[i].backed_off, backed[i]) << i;
  }
  EXPECT_EQ(s.scale(), 256);
  // Overflows interrupt growth even when hysteresis absorbs them.
  run(s, "FIF");
  EXPECT_EQ(s.growth_tracker(), 1);
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, StaticModeKeepsScale) {
  auto o = small_options();
  o.init_scale = 128;
  LossScaler s(o, ScalerMode::kStatic);
  EXPECT_TRUE(s.enabled());
  auto u = run(s, "FFFFFIIIIIIF");
  for (size_t i = 0; i < u.size(); ++i) {
    EXPECT_EQ(u[i].scale_used, 128);
    EXPECT_EQ(u[i].next_scale, 128);
    EXPECT_EQ(u[i].skipped, i >= 5 && i <= 10);
    EXPECT_FALSE(u[i].grew || u[i].backed_off || u[i].stuck);
  }
  EXPECT_EQ(s.skipped_steps(), 6);
}

TEST(LossScaler, OffModeIsUnitScaleButStillSkipsOverflow) {
  LossScaler s(LossScalerOptions{}, ScalerMode::kOff);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1);
  EXPECT_EQ(s.inv_scale(), 1);
  auto u = run(s, "FIF");
  EXPECT_FALSE(u[0].skipped);
  EXPECT_TRUE(u[1].skipped);
  EXPECT_EQ(u[1].scale_used, 1);
  EXPECT_EQ(u[1].next_scale, 1);
  EXPECT_FALSE(u[1].backed_off);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScaler, ResolveMode) {
  LossScalerOptions o;
  EXPECT_EQ(resolve_scaler_mode(o, AmpDtype::kFp16), ScalerMode::kDynamic);
  EXPECT_EQ(resolve_scaler_mode(o, AmpDtype::kBf16), ScalerMode::kOff);
  EXPECT_EQ(resolve_scaler_mode(o, AmpDtype::kFp32), ScalerMode::kOff);
  for (ScalerMode m : {ScalerMode::kDynamic, ScalerMode::kStatic, ScalerMode::kOff}) {
    o.mode = m;
    EXPECT_EQ(resolve_scaler_mode(o, AmpDtype::kBf16), m) << name_of(m);
    EXPECT_EQ(resolve_scaler_mode(o, AmpDtype::kFp16), m) << name_of(m);
  }
  // An unknown mode is rejected where its name is read.
  EXPECT_THROW(parse_choice<ScalerMode>("sometimes", "amp.scaler.mode"), Error);
}

TEST(LossScaler, ValidateNamesEachBadKey) {
  struct Bad {
    const char* key;
    void (*set)(LossScalerOptions&);
  };
  const std::vector<Bad> cases = {
      {"amp.scaler.init_scale", [](LossScalerOptions& o) { o.init_scale = 0; }},
      {"amp.scaler.init_scale", [](LossScalerOptions& o) { o.init_scale = 1.0 / 0.0; }},
      {"amp.scaler.growth_factor", [](LossScalerOptions& o) { o.growth_factor = 1.0; }},
      {"amp.scaler.backoff_factor", [](LossScalerOptions& o) { o.backoff_factor = 1.0; }},
      {"amp.scaler.backoff_factor", [](LossScalerOptions& o) { o.backoff_factor = 0.0; }},
      {"amp.scaler.growth_interval", [](LossScalerOptions& o) { o.growth_interval = 0; }},
      {"amp.scaler.max_scale", [](LossScalerOptions& o) { o.max_scale = -1; }},
      {"amp.scaler.max_scale", [](LossScalerOptions& o) { o.max_scale = 1024; }},  // < init_scale
      {"amp.scaler.min_scale", [](LossScalerOptions& o) { o.min_scale = 0; }},
      {"amp.scaler.min_scale", [](LossScalerOptions& o) { o.min_scale = 1e6; }},  // > init_scale
      {"amp.scaler.hysteresis", [](LossScalerOptions& o) { o.hysteresis = 0; }},
      {"amp.scaler.min_scale_patience", [](LossScalerOptions& o) { o.min_scale_patience = 0; }},
  };
  for (const auto& c : cases) {
    LossScalerOptions o;
    c.set(o);
    try {
      LossScaler s(o, ScalerMode::kDynamic);  // the constructor validates
      ADD_FAILURE() << "no error for " << c.key;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << c.key;
      EXPECT_EQ(e.where(), c.key);
      EXPECT_THAT(e.what(), HasSubstr(c.key));
    }
  }
  // A mode name is checked by the config loader, which names the key and the valid modes.
  try {
    config::load_config("", {"amp.scaler.mode=always"});
    ADD_FAILURE() << "no error for amp.scaler.mode";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.where(), HasSubstr("amp.scaler.mode"));
    EXPECT_THAT(e.what(), HasSubstr("amp.scaler.mode: 'always' is not valid (valid: auto, dynamic, static, off)"));
  }
  LossScalerOptions o;
  o.max_scale = 0;  // 0 disables the cap: valid
  EXPECT_NO_THROW(o.validate());
  try {
    LossScaler s(LossScalerOptions{}, ScalerMode::kAuto);  // must be resolved first
    ADD_FAILURE() << "auto accepted as a resolved mode";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "amp.scaler.mode");
  }
}

TEST(LossScaler, StateDictRoundTripContinuesExactly) {
  auto o = small_options();
  o.hysteresis = 2;
  o.min_scale = 64;
  o.max_scale = 4096;
  const std::string head = "FFFFIFFFIIIIIIIIFIIIII", tail = "IIFFFFFFFIIIIIIFIFFFFFFFFFFFF";
  LossScaler a(o, ScalerMode::kDynamic);
  run(a, head);
  const auto saved = a.state_dict();
  // Saved mid-hysteresis and mid-streak at the floor, so every counter matters.
  EXPECT_EQ(saved["scale"], 64);
  EXPECT_EQ(saved["hysteresis_left"], 1);
  EXPECT_GE(saved["overflows_at_min"], 1);
  // Through text, as it travels in a checkpoint.
  LossScaler b(o, ScalerMode::kDynamic);
  b.load_state_dict(nlohmann::json::parse(saved.dump()));
  EXPECT_EQ(b.state_dict(), saved);
  const auto ua = run(a, tail), ub = run(b, tail);
  for (size_t i = 0; i < ua.size(); ++i) {
    EXPECT_EQ(ua[i].scale_used, ub[i].scale_used) << i;
    EXPECT_EQ(ua[i].next_scale, ub[i].next_scale) << i;
    EXPECT_EQ(ua[i].skipped, ub[i].skipped) << i;
    EXPECT_EQ(ua[i].backed_off, ub[i].backed_off) << i;
    EXPECT_EQ(ua[i].grew, ub[i].grew) << i;
    EXPECT_EQ(ua[i].stuck, ub[i].stuck) << i;
  }
  EXPECT_TRUE(ub[1].stuck);  // the third overflow at the floor, two of them before the save
  EXPECT_EQ(a.state_dict(), b.state_dict());
  EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
  // A non-power-of-two scale survives the text round trip bit for bit.
  auto odd = saved;
  odd["scale"] = 100.0 / 3.0 * 7;
  LossScaler c(o, ScalerMode::kDynamic);
  c.load_state_dict(nlohmann::json::parse(odd.dump()));
  EXPECT_EQ(c.scale(), 100.0 / 3.0 * 7);
}

TEST(LossScaler, LoadStateDictRejectsGarbage) {
  LossScaler s(small_options(), ScalerMode::kDynamic);
  s.update(true);
  const auto good = s.state_dict();
  std::vector<nlohmann::json> bad = {nlohmann::json::array(), nlohmann::json(3),
                                     nlohmann::json::object()};
  for (const char* key : {"mode", "scale", "growth_tracker", "hysteresis_left", "overflows_at_min",
                          "skipped_steps"}) {
    auto j = good;
    j.erase(key);
    bad.push_back(j);
    j = good;
    j[key] = "x";
    bad.push_back(j);
  }
  for (const char* key : {"growth_tracker", "skipped_steps"}) {
    auto j = good;
    j[key] = -1;
    bad.push_back(j);
    j[key] = 1.5;
    bad.push_back(j);
  }
  for (double scale : {0.0, -2.0}) {
    auto j = good;
    j["scale"] = scale;
    bad.push_back(j);
  }
  auto wrong_mode = good;
  wrong_mode["mode"] = "static";
  bad.push_back(wrong_mode);
  const auto before = s.state_dict();
  for (const auto& j : bad) {
    try {
      s.load_state_dict(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_EQ(e.where(), "loss scaler state") << j.dump();
    }
    EXPECT_EQ(s.state_dict(), before) << "a rejected state changed the scaler: " << j.dump();
  }
  // Mode mismatch across precisions (fp16 checkpoint resumed under bf16) says so.
  LossScaler off(LossScalerOptions{}, ScalerMode::kOff);
  try {
    off.load_state_dict(good);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("dynamic"));
  }
}

TEST(LossScaler, LoadStateDictRespectsChangedOptions) {
  auto o = small_options();
  o.growth_interval = 10;
  o.hysteresis = 4;
  LossScaler a(o, ScalerMode::kDynamic);
  run(a, "FFFFFFFFI");  // tracker reset by the overflow, hysteresis_left 3
  run(a, "FFFFFFF");    // tracker 7, hysteresis 4
  auto st = a.state_dict();
  st["scale"] = 1e9;
  auto p = o;
  p.growth_interval = 3;
  p.hysteresis = 2;
  p.max_scale = 2048;
  LossScaler b(p, ScalerMode::kDynamic);
  b.load_state_dict(st);
  EXPECT_EQ(b.scale(), 2048);        // clamped to the new cap
  EXPECT_EQ(b.growth_tracker(), 2);  // one short of the new interval
  EXPECT_EQ(b.state_dict()["hysteresis_left"], 2);
  // Static keeps its configured scale; the counters come back.
  auto so = o;
  so.init_scale = 256;
  LossScaler st1(so, ScalerMode::kStatic);
  run(st1, "IIF");
  so.init_scale = 512;
  LossScaler st2(so, ScalerMode::kStatic);
  st2.load_state_dict(st1.state_dict());
  EXPECT_EQ(st2.scale(), 512);
  EXPECT_EQ(st2.skipped_steps(), 2);
}

}  // namespace
}  // namespace gradguard::amp
