// Ranks agree before they train: under distributed.strategy=ddp|zero1 every rank describes what it
// is about to train (its resolved config and world layout, then its model's tensors) as a
// canonical text, and the ranks compare these with rank 0's before any collective depends on
// them. A difference is an error on every rank that names the first keys or tensors that differ,
// instead of a truncated message inside MPI, a corrupted heap, or a run that trains to the end
// on mismatched hyperparameters. See Note [ranks agree before they train] in rank_agreement.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "launcher/config.h"
#include "tinygrad/nn/module.h"

namespace tg::launcher {

// The config keys that may differ between ranks (only rank 0's is used, or each rank's is its own
// by design): train.run_dir, train.overwrite, train.device. See Note [keys that may differ per rank].
const std::vector<std::string>& per_rank_config_keys();

// One line per config key ("config optim.lr = 0.001", exact values) and per world fact
// ("world size = 2"), the per-rank keys left out.
std::string config_agreement_text(const Config& cfg, const dist::ProcessGroup& group);
// One line per tensor of the model's state dict: "tensor 1.weight = float32[256,784]".
std::string model_agreement_text(const nn::Module& model);

// 64-bit FNV-1a: the digest the ranks exchange.
uint64_t digest64(const std::string& text);

// The differences between rank 0's text and another rank's, one per line name in the order of
// rank 0's text (then names only the other rank has), at most `limit`, each as
// "model.hidden: [128] on rank 1, [256] on rank 0"; a last entry says how many more there are.
std::vector<std::string> text_differences(const std::string& rank0_text, const std::string& other_text, int other_rank,
                                          size_t limit = 4);

// Collective: every rank passes its own text; returns when every rank's equals rank 0's, and
// otherwise throws on every rank an Error naming the ranks that differ and the first
// differences of the lowest of them (and of this rank, when it differs too). `what` names the
// comparison in the message ("config", "model").
void check_ranks_agree(dist::ProcessGroup& group, const std::string& what, const std::string& text);

}  // namespace tg::launcher
