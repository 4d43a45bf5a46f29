// What the machine's memory is, from Linux's /proc/meminfo: one reader for every check
// that asks (doctor's memory line, the trainer's refusal of a model that cannot fit).
#pragma once

#include <map>
#include <optional>
#include <string>

namespace gradguard {

// /proc/meminfo's fields in bytes ("MemTotal", "MemAvailable", "SwapFree", ...: the
// file's kB values times 1024); nullopt where the file cannot be read.
std::optional<std::map<std::string, double>> read_meminfo();

}  // namespace gradguard
