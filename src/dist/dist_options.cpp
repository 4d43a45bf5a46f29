// Validation of the `dist` config section.
#include "gradguard/dist/dist_options.h"

#include <cmath>

#include "gradguard/core/error.h"

namespace gradguard::dist {

void DistOptions::validate() const {
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    throw bad_input("dist.timeout_s", "must be a positive number of seconds, got " + format_number(timeout_s));
  if (!(bucket_mb > 0) || !std::isfinite(bucket_mb))
    throw bad_input("dist.bucket_mb", "must be a positive size in MiB, got " + format_number(bucket_mb));
  if (powersgd_rank < 1)
    throw bad_input("dist.powersgd_rank", "must be >= 1, got " + std::to_string(powersgd_rank));
  if (powersgd_start_step < 0)
    throw bad_input("dist.powersgd_start_step", "must be >= 0, got " + std::to_string(powersgd_start_step));
  if (check_every < 0)
    throw bad_input("dist.check_every", "must be >= 0 (0 disables), got " + std::to_string(check_every));
  if (!(heartbeat_s > 0) || !std::isfinite(heartbeat_s))
    throw bad_input("dist.heartbeat_s", "must be a positive number of seconds, got " + format_number(heartbeat_s));
  if (heartbeat_s * 3 > timeout_s)
    throw bad_input("dist.heartbeat_s", "must be at most a third of dist.timeout_s (" + format_number(timeout_s) +
                                            "), got " + format_number(heartbeat_s));
}

}  // namespace gradguard::dist
