// Byte sizes as people write them: "8GiB", "512MiB", "8g" (HAMi, base 1024), "8GB"
// (base 1000), or a plain number of bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tessera {

// Parses a size; false on anything that is not exactly a non-negative size that fits.
bool parse_size(std::string_view text, std::uint64_t& bytes);

// Writes a short human form ("8.00 GiB", "512 B") into out.
void format_size(std::uint64_t bytes, char* out, std::size_t out_size);

}  // namespace tessera
