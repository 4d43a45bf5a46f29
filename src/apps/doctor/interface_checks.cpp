// The network-interface rules: NCCL_SOCKET_IFNAME in NCCL's list syntax (prefixes,
// "^" exclusion, "=" exact names, ":port" suffixes) and GLOO_SOCKET_IFNAME, which
// gradguard's Gloo communicator passes to Gloo as one exact interface name. Both are
// judged against the interfaces the host really has (HostFacts), so a name copied from
// another cluster fails here instead of at rendezvous.
#include <algorithm>

#include "doctor_internal.h"

namespace gradguard::doctor {

using detail::join;
using detail::make_check;
using detail::split;
using detail::trim;

std::vector<std::string> match_nccl_interfaces(const std::string& spec,
                                               const std::vector<std::string>& names) {
  std::string s = trim(spec);
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s.erase(0, 1);
  std::vector<std::string> entries;
  for (const auto& item : split(s, ',')) {
    const std::string e = trim(item.substr(0, item.find(':')));  // "eth0:1234": port ignored
    if (!e.empty()) entries.push_back(e);
  }
  std::vector<std::string> out;
  for (const auto& name : names) {
    const bool listed = std::any_of(entries.begin(), entries.end(), [&](const std::string& e) {
      return exact ? name == e : name.compare(0, e.size(), e) == 0;
    });
    if (listed != exclude) out.push_back(name);
  }
  return out;
}

namespace detail {
namespace {

Check named(const std::string& var, Status status, const std::string& value, std::string detail) {
  return make_check("env." + var, status, var + "=" + value, std::move(detail));
}

}  // namespace

Check check_nccl_socket_ifname(const std::string& var, const std::string& value,
                               const HostFacts& host) {
  std::vector<std::string> names;
  for (const auto& i : host.interfaces) names.push_back(i.name);
  const std::string have =
      "this host has: " + (names.empty() ? std::string("none") : join(names, ", "));
  const auto matched = match_nccl_interfaces(value, names);
  if (matched.empty())
    return named(
        var, Status::kFail, value,
        "matches no network interface, so NCCL cannot bootstrap (" + have +
            "). Syntax: prefixes \"eth,ib\", exact names \"=eth0\", exclusions \"^docker,lo\"");
  // Entries that match nothing: a typo among several, or an exclusion that excludes nothing.
  std::string spec = value;
  const bool exclude = !spec.empty() && spec[0] == '^';
  if (exclude) spec.erase(0, 1);
  const bool exact = !spec.empty() && spec[0] == '=';
  if (exact) spec.erase(0, 1);
  std::vector<std::string> dead;
  for (const auto& entry : split(spec, ',')) {
    const std::string e = trim(entry.substr(0, entry.find(':')));
    if (e.empty()) continue;
    if (match_nccl_interfaces((exclude ? "^" : "") + std::string(exact ? "=" : "") + e, names)
            .size() == (exclude ? names.size() : 0))
      dead.push_back(e);
  }
  std::vector<std::string> down;
  for (const auto& i : host.interfaces)
    if (std::find(matched.begin(), matched.end(), i.name) != matched.end() && !i.up)
      down.push_back(i.name);
  const std::string uses = "NCCL may use " + join(matched, ", ");
  if (!dead.empty())
    return named(var, Status::kWarn, value,
                 "entr" + std::string(dead.size() > 1 ? "ies " : "y ") + join(dead, ", ") +
                     " match" + (dead.size() > 1 ? "" : "es") + " no interface (typo?); " + uses +
                     " (" + have + ")");
  if (down.size() == matched.size())
    return named(var, Status::kWarn, value,
                 "every matching interface is down: " + join(down, ", "));
  return named(var, Status::kPass, value, uses);
}

Check check_gloo_socket_ifname(const std::string& var, const std::string& value,
                               const HostFacts& host) {
  std::vector<std::string> names;
  for (const auto& i : host.interfaces) names.push_back(i.name);
  const std::string have =
      "this host has: " + (names.empty() ? std::string("none") : join(names, ", "));
  if (value.find(',') != std::string::npos)
    return named(
        var, Status::kFail, value,
        "gradguard's Gloo communicator binds exactly one interface; name one (" + have + ")");
  const auto it = std::find_if(host.interfaces.begin(), host.interfaces.end(),
                               [&](const NetInterface& i) { return i.name == value; });
  if (it == host.interfaces.end())
    return named(var, Status::kFail, value,
                 "no such network interface, so every distributed run stops at rendezvous (" +
                     have + "; Gloo wants an exact name, not a prefix)");
  if (!it->up) return named(var, Status::kWarn, value, "interface " + value + " is down");
  if (!it->has_ipv4)
    return named(var, Status::kWarn, value, "interface " + value + " has no IPv4 address");
  return named(var, Status::kPass, value, "");
}

}  // namespace detail
}  // namespace gradguard::doctor
