// The files the HTML report inlines, embedded into the library at build time by
// cmake/EmbedAssets.cmake (see CMakeLists.txt for the list and their sources).
#pragma once

#include <string>
#include <string_view>

namespace gradguard::report::assets {

extern const std::string_view kPageHtml;      // src/apps/report_assets/report.html (with @NAME@ slots)
extern const std::string_view kReportJs;      // src/apps/report_assets/report.js
extern const std::string_view kReportCss;     // src/apps/report_assets/report.css
extern const std::string_view kUplotJs;       // node_modules/uplot/dist/uPlot.iife.min.js
extern const std::string_view kUplotCss;      // node_modules/uplot/dist/uPlot.min.css
extern const std::string_view kUplotLicense;  // node_modules/uplot/LICENSE

// Text placed inside <script> or <style> must not close it early: "</" becomes "<\/".
inline std::string script_safe(std::string text) {
  for (size_t at = 0; (at = text.find("</", at)) != std::string::npos; at += 3) text.replace(at, 2, "<\\/");
  return text;
}

// Text placed inside an HTML comment (the uPlot license) must not end it: "--" becomes "- -".
inline std::string comment_safe(std::string text) {
  for (size_t at = 0; (at = text.find("--", at)) != std::string::npos;) text.replace(at, 2, "- -");
  return text;
}

}  // namespace gradguard::report::assets
