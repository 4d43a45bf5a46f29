// AdamW against torch.optim.AdamW with two param groups (tests/golden/adamw.json).
#include "gradguard/optim/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden_util.h"
#include "gradguard/config/config.h"
#include "gradguard/core/error.h"

namespace gradguard::optim {
namespace {

// AdamW against torch.optim.AdamW (tests/golden/adamw.json), for every kernel: adamw_test.cpp.

TEST(AdamW, DecayOnlyOnMatrices) {
  auto w = torch::ones({2, 2}, torch::requires_grad());
  auto b = torch::ones({2}, torch::requires_grad());
  OptimOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  auto opt = make_optimizer({{"w", w}, {"b", b}}, o);
  w.mutable_grad() = torch::zeros({2, 2});
  b.mutable_grad() = torch::zeros({2});
  opt->step();  // zero gradient: only decay moves the weights
  EXPECT_TRUE(torch::allclose(w, torch::full({2, 2}, 1.0f - 0.1f * 0.5f)));
  EXPECT_TRUE(torch::equal(b, torch::ones({2})));
}

TEST(AdamW, TheTokenEmbeddingDecaysOnlyWhenAskedTo) {
  // Zero gradients: only weight decay moves anything. For every optimizer and for the
  // sharded one, the embedding keeps its values unless optim.decay_embeddings.
  for (const auto kind : {OptimizerKind::kAdamW, OptimizerKind::kLamb, OptimizerKind::kLars}) {
    for (const bool decay_embeddings : {false, true}) {
      SCOPED_TRACE(std::string(name_of(kind)) + (decay_embeddings ? ", decay_embeddings" : ""));
      auto emb = torch::ones({3, 2}, torch::requires_grad());
      auto w = torch::ones({2, 2}, torch::requires_grad());
      auto b = torch::ones({2}, torch::requires_grad());
      OptimOptions o;
      o.name = kind;
      o.lr = 0.1;
      o.weight_decay = 0.5;
      o.decay_embeddings = decay_embeddings;
      const NamedParameters named = {{"model.embed_tokens.weight", emb}, {"w", w}, {"b", b}};
      EXPECT_EQ(decays("model.embed_tokens.weight", emb, o), decay_embeddings);
      EXPECT_TRUE(decays("w", w, o));
      EXPECT_FALSE(decays("b", b, o));
      auto opt = make_optimizer(named, o);
      for (auto* p : {&emb, &w, &b}) p->mutable_grad() = torch::zeros_like(*p);
      opt->step();
      EXPECT_LT(w.max().item<float>(), 1.0f);  // decayed (LARS: its L2 term in the update)
      EXPECT_TRUE(torch::equal(b, torch::ones({2})));
      EXPECT_EQ(torch::equal(emb, torch::ones({3, 2})), !decay_embeddings);
      if (kind != OptimizerKind::kAdamW) {
        // LAMB/LARS keep the embedding layer-adaptive in a group of its own without decay.
        ASSERT_EQ(opt->param_groups().size(), decay_embeddings ? 2u : 3u);
      }
    }
  }
}

TEST(AdamW, RejectsBadOptions) {
  auto check = [](OptimOptions o, const std::string& key) {
    try {
      o.validate();
      FAIL() << key;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(key));
    }
  };
  OptimOptions o;
  o.lr = -1e-3;
  check(o, "optim.lr");
  o = {};
  o.betas = {0.9, 1.0};
  check(o, "optim.betas");
  o = {};
  o.eps = 0;
  check(o, "optim.eps");
  o = {};
  o.weight_decay = -0.1;
  check(o, "optim.weight_decay");
  // An unknown optimizer is rejected where the config is read, with the valid names.
  try {
    config::load_config("", {"optim.name=sgdd"});
    FAIL() << "optim.name";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("optim.name: 'sgdd' is not valid (valid: adamw, lamb, lars, adam_atan2)"));
  }
}

}  // namespace
}  // namespace gradguard::optim
