// String helpers for host code (the node agent, the extender, the CLI). Guest code (the hook,
// the simulated driver) has common/text.h, which never throws.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::base {

// ASCII lower case, as NVIDIA's plugin compares names and words in configs.
std::string lower(std::string text);

// Every part between separators, empty ones included: "a,,b" is {"a", "", "b"}.
std::vector<std::string> split(std::string_view text, char separator);

// The parts of a list as people write it ("a, b,,c "): blanks around each part are dropped,
// and so are the parts left empty.
std::vector<std::string> split_list(std::string_view text, char separator);

std::string join(const std::vector<std::string>& parts, std::string_view separator);

}  // namespace tessera::base
