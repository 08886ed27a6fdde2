#include "model/lora_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "model/gpt_config.h"
#include "model/model_config.h"
#include "model/parameter_init.h"

namespace ps {
namespace {

constexpr absl::string_view kPeftPrefix = "base_model.model.";
constexpr absl::string_view kGpt2Prefix = "transformer.";

bool IsGpt2(const ModelConfig& model) { return model.architecture() == ModelArchitecture::kGpt2; }

// The last dotted component of `name`.
absl::string_view LastComponent(absl::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == absl::string_view::npos ? name : name.substr(dot + 1);
}

// `name` without its last dotted component ("" if it has none).
absl::string_view Parent(absl::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == absl::string_view::npos ? absl::string_view() : name.substr(0, dot);
}

// The Hugging Face full name of our module or tensor name.
std::string HfName(const ModelConfig& model, absl::string_view ours) {
  if (!IsGpt2(model) || ours == "lm_head" || absl::StartsWith(ours, "lm_head.")) {
    return std::string(ours);
  }
  return absl::StrCat(kGpt2Prefix, ours);
}

// PEFT's target_modules rule for a list: the full name or a dotted suffix.
bool TargetMatches(absl::string_view entry, absl::string_view full) {
  return full == entry || (full.size() > entry.size() && absl::EndsWith(full, entry) &&
                           full[full.size() - entry.size() - 1] == '.');
}

// PEFT's exclusion of targets that modules_to_save names: re.match(r"(^|.*\.)m($|\..*)", key),
// i.e. `entry` appears in `full` on dotted boundaries.
bool DottedContains(absl::string_view full, absl::string_view entry) {
  size_t pos = 0;
  while ((pos = full.find(entry, pos)) != absl::string_view::npos) {
    const bool starts = pos == 0 || full[pos - 1] == '.';
    const size_t end = pos + entry.size();
    const bool ends = end == full.size() || full[end] == '.';
    if (starts && ends) return true;
    ++pos;
  }
  return false;
}

enum class ModuleKind { kLinear, kLmHead, kOther };

// A module of the Hugging Face model that owns parameters (or the tied LM head).
struct LeafModule {
  std::string ours;  // our name, e.g. "h.0.attn.c_attn"
  std::string full;  // Hugging Face full name, e.g. "transformer.h.0.attn.c_attn"
  ModuleKind kind = ModuleKind::kOther;
  bool tied_embedding = false;       // lm_head / embed_tokens / wte of a tied model
  std::vector<std::string> tensors;  // our tensor names (whole)
};

// The model's modules: leaves in forward order, then containers.
struct ModuleTree {
  std::vector<LeafModule> leaves;
  std::set<std::string> containers;  // full names of modules with submodules
};

const std::vector<std::string>& LinearNames(const ModelConfig& model) {
  static const std::vector<std::string>* const kLlama = new std::vector<std::string>{
      "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  static const std::vector<std::string>* const kGpt2 =
      new std::vector<std::string>{"c_attn", "c_proj", "c_fc"};
  return IsGpt2(model) ? *kGpt2 : *kLlama;
}

ModuleTree BuildModuleTree(const ModelConfig& model) {
  ModuleTree tree;
  absl::flat_hash_map<std::string, size_t> index;
  const std::vector<std::string>& linear = LinearNames(model);
  const std::string embedding = IsGpt2(model) ? "wte" : "model.embed_tokens";
  for (const OperatorSpec& op : ModelOperators(model)) {
    for (const TensorSpec& t : op.tensors) {
      const std::string module(Parent(t.name));
      auto [it, inserted] = index.try_emplace(module, tree.leaves.size());
      if (inserted) {
        LeafModule leaf;
        leaf.ours = module;
        leaf.full = HfName(model, module);
        const absl::string_view last = LastComponent(module);
        if (module == "lm_head") {
          leaf.kind = ModuleKind::kLmHead;
        } else if (absl::StrContains(module, ".") &&
                   std::find(linear.begin(), linear.end(), last) != linear.end()) {
          leaf.kind = ModuleKind::kLinear;
        }
        leaf.tied_embedding = model.tie_word_embeddings && module == embedding;
        tree.leaves.push_back(std::move(leaf));
      }
      tree.leaves[it->second].tensors.push_back(t.name);
    }
  }
  if (model.tie_word_embeddings) {
    LeafModule head;
    head.ours = "lm_head";
    head.full = "lm_head";
    head.kind = ModuleKind::kLmHead;
    head.tied_embedding = true;
    tree.leaves.push_back(std::move(head));
  }
  for (const LeafModule& leaf : tree.leaves) {
    for (absl::string_view p = Parent(leaf.full); !p.empty(); p = Parent(p)) {
      tree.containers.insert(std::string(p));
    }
  }
  return tree;
}

bool IsAllLinear(const LoraConfig& lora) {
  return lora.target_modules.size() == 1 && lora.target_modules[0] == kLoraAllLinear;
}

std::string Describe(const ModelConfig& model) {
  return absl::StrCat(model.name.empty() ? "the model" : absl::StrCat("model '", model.name, "'"),
                      " (", ModelFamilyName(model.family), ")");
}

// The leaves modules_to_save matches (PEFT's _set_trainable: a plain suffix), checked.
absl::StatusOr<std::vector<const LeafModule*>> SavedLeaves(const ModelConfig& model,
                                                           const ModuleTree& tree,
                                                           const LoraConfig& lora) {
  std::vector<const LeafModule*> saved;
  absl::flat_hash_set<const LeafModule*> seen;
  for (const std::string& entry : lora.modules_to_save) {
    if (entry.empty()) {
      return absl::InvalidArgumentError("lora.modules_to_save has an empty entry");
    }
    for (const std::string& c : tree.containers) {
      if (absl::EndsWith(c, entry)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lora.modules_to_save entry '", entry, "' matches ", c,
            ", a module with submodules; modules_to_save here takes modules with parameters of "
            "their own (e.g. lm_head, embed_tokens, norm)"));
      }
    }
    bool any = false;
    for (const LeafModule& leaf : tree.leaves) {
      if (!absl::EndsWith(leaf.full, entry)) continue;
      any = true;
      if (leaf.tied_embedding) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lora.modules_to_save entry '", entry, "' names ", leaf.full, ", which ",
            Describe(model),
            " ties to the token embedding (tie_word_embeddings); PEFT's modules_to_save copies "
            "the module and so unties it, and the adapter would not reproduce this model. Leave "
            "it out, or fine-tune a model with untied embeddings"));
      }
      if (seen.insert(&leaf).second) saved.push_back(&leaf);
    }
    if (!any) {
      std::vector<std::string> names;
      for (const LeafModule& leaf : tree.leaves) {
        const std::string last(LastComponent(leaf.full));
        if (std::find(names.begin(), names.end(), last) == names.end()) names.push_back(last);
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "lora.modules_to_save entry '", entry, "' matches no module of ", Describe(model),
          "; its modules with parameters are ", absl::StrJoin(names, ", ")));
    }
  }
  // Each operator is trained whole or not at all.
  absl::flat_hash_set<std::string> tensors;
  for (const LeafModule* leaf : saved) tensors.insert(leaf->tensors.begin(), leaf->tensors.end());
  for (const OperatorSpec& op : ModelOperators(model)) {
    std::vector<std::string> missing;
    for (const TensorSpec& t : op.tensors) {
      if (!tensors.contains(t.name)) missing.push_back(t.name);
    }
    if (!missing.empty() && missing.size() < op.tensors.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lora.modules_to_save covers only part of operator ", op.name, " (", missing.size(),
          " of its ", op.tensors.size(), " tensors are not saved: ", absl::StrJoin(missing, ", "),
          "); its tensors are trained together, so save all of its modules or none"));
    }
  }
  std::sort(saved.begin(), saved.end());
  return saved;
}

// Phi-3's checkpoint fuses q/k/v into qkv_proj and gate/up into gate_up_proj, which PEFT adapts
// whole (one A for the fused matrix); the model keeps them split, so an adapter there cannot be
// PEFT's. OK when no leaf of `targets` is one of those (o_proj and down_proj are Phi-3's own).
absl::Status CheckPhi3Targets(const ModelConfig& model,
                              const std::vector<const LeafModule*>& targets) {
  if (model.family != ModelFamily::kPhi3) return absl::OkStatus();
  for (const LeafModule* leaf : targets) {
    const absl::string_view last = LastComponent(leaf->ours);
    if (last == "o_proj" || last == "down_proj") continue;
    const bool attention = last == "q_proj" || last == "k_proj" || last == "v_proj";
    return absl::UnimplementedError(absl::StrCat(
        "lora.target_modules: ", Describe(model), " stores ", leaf->full, " inside the fused ",
        attention ? "self_attn.qkv_proj" : "mlp.gate_up_proj",
        ", which LoRA here does not adapt yet (PEFT's adapter on it has one A for the fused "
        "matrix); target o_proj and down_proj"));
  }
  return absl::OkStatus();
}

// The targeted linear leaves, in forward order (checked, except r).
absl::StatusOr<std::vector<const LeafModule*>> TargetedLeaves(
    const ModelConfig& model, const ModuleTree& tree, const LoraConfig& lora,
    const std::vector<const LeafModule*>& saved) {
  const auto is_saved = [&](const LeafModule& leaf) {
    if (std::binary_search(saved.begin(), saved.end(), &leaf)) return true;
    for (const std::string& m : lora.modules_to_save) {
      if (DottedContains(leaf.full, m)) return true;
    }
    return false;
  };
  const std::string linear_list = absl::StrJoin(LinearNames(model), ", ");
  if (lora.target_modules.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.target_modules is empty; name the linear layers to adapt (", linear_list,
                     ") or \"all-linear\""));
  }
  std::vector<const LeafModule*> targets;
  if (IsAllLinear(lora)) {
    for (const LeafModule& leaf : tree.leaves) {
      if (leaf.kind == ModuleKind::kLinear && !is_saved(leaf)) targets.push_back(&leaf);
    }
    if (targets.empty()) {
      return absl::InvalidArgumentError(
          "lora.target_modules \"all-linear\" leaves no layer to adapt: modules_to_save "
          "names them all");
    }
    RETURN_IF_ERROR(CheckPhi3Targets(model, targets));
    return targets;
  }
  absl::flat_hash_set<const LeafModule*> chosen;
  for (const std::string& entry : lora.target_modules) {
    if (entry == kLoraAllLinear) {
      return absl::InvalidArgumentError(
          "lora.target_modules: \"all-linear\" must be the only entry");
    }
    if (entry.empty()) return absl::InvalidArgumentError("lora.target_modules has an empty entry");
    if (model.family == ModelFamily::kPhi3 &&
        (TargetMatches(entry, "model.layers.0.self_attn.qkv_proj") ||
         TargetMatches(entry, "model.layers.0.mlp.gate_up_proj"))) {
      return absl::UnimplementedError(absl::StrCat(
          "lora.target_modules entry '", entry, "': ", Describe(model),
          "'s fused qkv_proj and gate_up_proj are not adapted by LoRA here yet; target o_proj "
          "and down_proj"));
    }
    const std::string hint = absl::StrCat(
        "LoRA applies to the blocks' linear layers of ", Describe(model), ": ", linear_list,
        " (a dotted suffix such as ", IsGpt2(model) ? "attn.c_attn" : "self_attn.q_proj",
        ", a full name, or \"all-linear\" also work)");
    for (const std::string& c : tree.containers) {
      if (TargetMatches(entry, c)) {
        return absl::InvalidArgumentError(absl::StrCat("lora.target_modules entry '", entry,
                                                       "' matches ", c,
                                                       ", a module with submodules; ", hint));
      }
    }
    bool any = false;
    for (const LeafModule& leaf : tree.leaves) {
      if (!TargetMatches(entry, leaf.full)) continue;
      any = true;
      if (leaf.kind == ModuleKind::kLmHead) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lora.target_modules entry '", entry,
            "' targets the LM head, which LoRA here does not adapt (train it in full with "
            "modules_to_save, if untied); ",
            hint));
      }
      if (leaf.kind != ModuleKind::kLinear) {
        return absl::InvalidArgumentError(absl::StrCat("lora.target_modules entry '", entry,
                                                       "' matches ", leaf.full,
                                                       ", which is not a linear layer; ", hint));
      }
      if (is_saved(leaf)) {
        return absl::InvalidArgumentError(
            absl::StrCat("module ", leaf.full, " is both targeted (lora.target_modules entry '",
                         entry, "') and saved in full (lora.modules_to_save); choose one"));
      }
      chosen.insert(&leaf);
    }
    if (!any) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora.target_modules entry '", entry, "' matches no module; ", hint));
    }
  }
  for (const LeafModule& leaf : tree.leaves) {
    if (chosen.contains(&leaf)) targets.push_back(&leaf);
  }
  RETURN_IF_ERROR(CheckPhi3Targets(model, targets));
  return targets;
}

// The base operator holding each tensor (unsplit operators).
absl::flat_hash_map<std::string, std::string> OperatorOfTensor(const ModelConfig& model) {
  absl::flat_hash_map<std::string, std::string> op_of;
  for (const OperatorSpec& op : ModelOperators(model)) {
    for (const TensorSpec& t : op.tensors) op_of[t.name] = op.name;
  }
  return op_of;
}

absl::flat_hash_map<std::string, std::vector<int64_t>> ShapeOfTensor(const ModelConfig& model) {
  absl::flat_hash_map<std::string, std::vector<int64_t>> shape_of;
  for (const OperatorSpec& op : ModelOperators(model)) {
    for (const TensorSpec& t : op.tensors) shape_of[t.name] = t.shape;
  }
  return shape_of;
}

std::vector<LoraTarget> MakeTargets(const ModelConfig& model,
                                    absl::Span<const LeafModule* const> leaves) {
  const absl::flat_hash_map<std::string, std::string> op_of = OperatorOfTensor(model);
  const absl::flat_hash_map<std::string, std::vector<int64_t>> shape_of = ShapeOfTensor(model);
  const bool conv1d = IsGpt2(model);
  std::vector<LoraTarget> targets;
  for (const LeafModule* leaf : leaves) {
    LoraTarget t;
    t.module = leaf->ours;
    t.base_weight = absl::StrCat(leaf->ours, ".weight");
    t.base_op = op_of.at(t.base_weight);
    t.adapter_op = absl::StrCat(t.base_op, ".lora");
    t.a = absl::StrCat(leaf->ours, ".lora_A.weight");
    t.b = absl::StrCat(leaf->ours, ".lora_B.weight");
    const std::vector<int64_t>& shape = shape_of.at(t.base_weight);
    t.conv1d = conv1d;
    t.in = conv1d ? shape[0] : shape[1];
    t.out = conv1d ? shape[1] : shape[0];
    targets.push_back(std::move(t));
  }
  return targets;
}

}  // namespace

absl::Status ValidateLoraConfig(const ModelConfig& model, const LoraConfig& lora) {
  if (lora.r <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("lora.r must be a positive rank, got ", lora.r));
  }
  if (!std::isfinite(lora.lora_alpha) || lora.lora_alpha <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.lora_alpha must be finite and positive (the scale is lora_alpha / r), got ",
        lora.lora_alpha));
  }
  if (!(lora.lora_dropout >= 0 && lora.lora_dropout < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.lora_dropout must be in [0, 1) (a probability of dropping), got ",
                     lora.lora_dropout));
  }
  if (lora.bias != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.bias '", lora.bias,
                     "' is not supported: only \"none\" is (the base model's biases stay frozen)"));
  }
  const ModuleTree tree = BuildModuleTree(model);
  ASSIGN_OR_RETURN(const std::vector<const LeafModule*> saved, SavedLeaves(model, tree, lora));
  ASSIGN_OR_RETURN(const std::vector<const LeafModule*> leaves,
                   TargetedLeaves(model, tree, lora, saved));
  for (const LoraTarget& t : MakeTargets(model, leaves)) {
    const int64_t limit = std::min(t.in, t.out);
    if (lora.r > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora.r = ", lora.r, " exceeds min(in, out) = ", limit,
                       " of targeted layer ", HfName(model, t.module), " (in ", t.in, ", out ",
                       t.out, "); choose r <= ", limit, " or leave that layer out"));
    }
  }
  return absl::OkStatus();
}

std::vector<LoraTarget> LoraTargets(const ModelConfig& model, const LoraConfig& lora) {
  const ModuleTree tree = BuildModuleTree(model);
  absl::StatusOr<std::vector<const LeafModule*>> saved = SavedLeaves(model, tree, lora);
  CHECK(saved.ok()) << saved.status();
  absl::StatusOr<std::vector<const LeafModule*>> leaves = TargetedLeaves(model, tree, lora, *saved);
  CHECK(leaves.ok()) << leaves.status();
  return MakeTargets(model, *leaves);
}

std::vector<std::string> LoraSavedTensors(const ModelConfig& model, const LoraConfig& lora) {
  const ModuleTree tree = BuildModuleTree(model);
  absl::StatusOr<std::vector<const LeafModule*>> saved = SavedLeaves(model, tree, lora);
  CHECK(saved.ok()) << saved.status();
  absl::flat_hash_set<std::string> set;
  for (const LeafModule* leaf : *saved) set.insert(leaf->tensors.begin(), leaf->tensors.end());
  std::vector<std::string> names;
  for (const OperatorSpec& op : ModelOperators(model)) {
    for (const TensorSpec& t : op.tensors) {
      if (set.contains(t.name)) names.push_back(t.name);
    }
  }
  return names;
}

std::vector<OperatorSpec> LoraModelOperators(const ModelConfig& model, const LoraConfig& lora,
                                             const VocabLayoutOptions& vocab) {
  const std::vector<std::string> saved_list = LoraSavedTensors(model, lora);
  const absl::flat_hash_set<std::string> saved(saved_list.begin(), saved_list.end());
  std::vector<OperatorSpec> ops = ModelOperators(model, vocab);
  for (OperatorSpec& op : ops) {
    bool all_saved = true;
    for (const TensorSpec& t : op.tensors) {
      const std::optional<RowBlockName> block = ParseRowBlockName(t.name);
      if (!saved.contains(block.has_value() ? block->base : t.name)) all_saved = false;
    }
    op.trainable = all_saved;
  }
  for (const LoraTarget& t : LoraTargets(model, lora)) {
    if (ops.back().name != t.adapter_op) {
      ops.push_back(OperatorSpec{t.adapter_op, {}});
    }
    ops.back().tensors.push_back(TensorSpec{t.a, {lora.r, t.in}});
    ops.back().tensors.push_back(TensorSpec{t.b, {t.out, lora.r}});
  }
  return ops;
}

std::string PeftTensorName(const ModelConfig& model, absl::string_view our_name) {
  return absl::StrCat(kPeftPrefix, HfName(model, our_name));
}

absl::StatusOr<std::string> TensorNameFromPeft(const ModelConfig& model,
                                               absl::string_view peft_name) {
  absl::string_view name = peft_name;
  if (!absl::ConsumePrefix(&name, kPeftPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name '", peft_name, "' does not start with PEFT's prefix '", kPeftPrefix, "'"));
  }
  if (IsGpt2(model) && name != "lm_head" && !absl::StartsWith(name, "lm_head.")) {
    if (!absl::ConsumePrefix(&name, kGpt2Prefix)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", peft_name, "' of a gpt2 adapter is neither under '",
                       kPeftPrefix, kGpt2Prefix, "' nor under '", kPeftPrefix, "lm_head'"));
    }
  }
  return std::string(name);
}

std::vector<std::string> LoraLinearModuleNames(const ModelConfig& model) {
  return LinearNames(model);
}

void InitLoraA(uint64_t seed, uint64_t stream, absl::Span<float> a, int64_t in_features) {
  CHECK_GT(in_features, 0);
  std::mt19937_64 gen = ParameterStream(seed, stream);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  for (float& x : a) {
    const double u = static_cast<double>(gen() >> 11) * 0x1.0p-53;  // [0, 1)
    x = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}

}  // namespace ps
