// Text cut at every occurrence of one separator (empty parts kept), for pope-eval's readers of
// flag values and task files.
#pragma once

#include <string>
#include <vector>

namespace pope {

inline std::vector<std::string> split_text(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (std::size_t at = text.find(separator); at != std::string::npos; at = text.find(separator, start)) {
    parts.push_back(text.substr(start, at - start));
    start = at + 1;
  }
  parts.push_back(text.substr(start));
  return parts;
}

}  // namespace pope
