// Precompiled header: the standard library and LibTorch headers every translation unit
// pulls in. Only stable third-party headers belong here; gradguard's own headers change
// often and would invalidate the PCH on every edit.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/torch.h>
