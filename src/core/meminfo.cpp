// Lines of /proc/meminfo are "Name:   value kB" (a few counts have no unit); every value
// is kept, in bytes for the kB ones.
#include "gradguard/core/meminfo.h"

#include <fstream>
#include <sstream>

namespace gradguard {

std::optional<std::map<std::string, double>> read_meminfo() {
  std::ifstream in("/proc/meminfo");
  if (!in) return std::nullopt;
  std::map<std::string, double> fields;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string name, unit;
    double value = 0;
    if (!(words >> name >> value) || name.size() < 2 || name.back() != ':') continue;
    words >> unit;
    name.pop_back();
    fields[name] = unit == "kB" ? value * 1024 : value;
  }
  return fields;
}

}  // namespace gradguard
