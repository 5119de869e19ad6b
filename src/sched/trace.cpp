#include "sched/trace.h"

#include <fmt/core.h>

#include <charconv>
#include <fstream>
#include <stdexcept>
#include <string_view>

namespace tessera::sched {
namespace {

std::vector<std::string_view> split_line(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    fields.push_back(line.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

class CsvReader {
 public:
  CsvReader(const std::string& path, const std::vector<std::string>& required) : path_(path) {
    input_.open(path);
    if (!input_) throw std::runtime_error(fmt::format("{}: cannot open", path));
    if (!next()) throw std::runtime_error(fmt::format("{}: empty file, expected a header", path));
    header_ = std::string(line_);
    const auto names = split_line(header_);
    for (std::size_t i = 0; i < required.size(); ++i) {
      if (i >= names.size() || names[i] != required[i]) {
        throw std::runtime_error(fmt::format("{}:1:{}: expected column '{}', found '{}'", path,
                                             i + 1, required[i], i < names.size() ? names[i] : ""));
      }
    }
    columns_ = names.size();
  }

  bool next() {
    std::string text;
    while (std::getline(input_, text)) {
      ++line_number_;
      if (!text.empty() && text.back() == '\r') text.pop_back();
      if (text.empty()) continue;
      storage_ = std::move(text);
      line_ = storage_;
      fields_ = split_line(line_);
      return true;
    }
    return false;
  }

  void expect_columns() const {
    if (fields_.size() != columns_) {
      throw std::runtime_error(fmt::format("{}:{}: {} fields, the header has {}", path_,
                                           line_number_, fields_.size(), columns_));
    }
  }

  std::string_view text(std::size_t column) const { return fields_[column]; }

  std::int64_t number(std::size_t column, std::int64_t minimum, std::int64_t maximum) const {
    const std::string_view field = fields_[column];
    std::int64_t value = 0;
    const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
    if (error != std::errc() || end != field.data() + field.size() || value < minimum ||
        value > maximum) {
      throw std::runtime_error(fmt::format("{}:{}:{}: '{}' is not a whole number from {} to {}",
                                           path_, line_number_, column + 1, field, minimum,
                                           maximum));
    }
    return value;
  }

  [[noreturn]] void fail(std::size_t column, const std::string& why) const {
    throw std::runtime_error(fmt::format("{}:{}:{}: {}", path_, line_number_, column + 1, why));
  }

  std::size_t columns() const { return columns_; }

 private:
  std::string path_;
  std::ifstream input_;
  std::string header_, storage_;
  std::string_view line_;
  std::vector<std::string_view> fields_;
  std::size_t columns_ = 0;
  int line_number_ = 0;
};

constexpr std::int64_t kLarge = std::int64_t{1} << 40;

}  // namespace

std::vector<NodeSpec> read_nodes(const std::string& path) {
  CsvReader csv(path, {"sn", "cpu_milli", "memory_mib", "gpu", "model"});
  std::vector<NodeSpec> nodes;
  while (csv.next()) {
    csv.expect_columns();
    NodeSpec node;
    node.name = csv.text(0);
    node.cpu_milli = csv.number(1, 0, kLarge);
    node.memory_mib = csv.number(2, 0, kLarge);
    node.gpus = static_cast<int>(csv.number(3, 0, kMostGpusPerNode));
    node.model = csv.text(4);
    if (node.gpus > 0 && node.model.empty()) csv.fail(4, "a node with GPUs needs a model");
    nodes.push_back(std::move(node));
  }
  if (nodes.empty()) throw std::runtime_error(fmt::format("{}: no nodes", path));
  return nodes;
}

std::vector<PodSpec> read_pods(const std::string& path) {
  CsvReader csv(path, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"});
  std::vector<PodSpec> pods;
  while (csv.next()) {
    csv.expect_columns();
    PodSpec pod;
    pod.name = csv.text(0);
    pod.cpu_milli = csv.number(1, 0, kLarge);
    pod.memory_mib = csv.number(2, 0, kLarge);
    pod.gpus = static_cast<int>(csv.number(3, 0, kMostGpusPerNode));
    pod.gpu_milli = static_cast<int>(csv.number(4, 0, kMilli));
    if (pod.gpus > 1 && pod.gpu_milli != kMilli) {
      csv.fail(4, fmt::format("a pod with {} GPUs must ask for 1000 milli-GPU each, not {}",
                              pod.gpus, pod.gpu_milli));
    }
    if (pod.gpus == 0) pod.gpu_milli = 0;
    if (pod.gpus > 0 && pod.gpu_milli == 0) csv.fail(4, "a GPU pod asks for 0 milli-GPU");
    if (csv.columns() > 5) {
      std::string_view spec = csv.text(5);
      while (!spec.empty()) {
        const std::size_t bar = spec.find('|');
        pod.models.emplace_back(spec.substr(0, bar));
        if (bar == std::string_view::npos) break;
        spec.remove_prefix(bar + 1);
      }
    }
    if (csv.columns() > 6) pod.qos = csv.text(6).substr(0, 32);
    if (csv.columns() > 9) {
      pod.creation_time = csv.number(8, 0, kLarge);
      if (!csv.text(9).empty()) pod.deletion_time = csv.number(9, 0, kLarge);
    }
    pods.push_back(std::move(pod));
  }
  if (pods.empty()) throw std::runtime_error(fmt::format("{}: no pods", path));
  return pods;
}

std::int32_t priority_of_qos(std::string_view qos) {
  if (qos == "LS" || qos == "Guaranteed") return 1000;
  if (qos == "Burstable") return 500;
  return 0;
}

void write_pods(const std::string& path, const std::vector<PodSpec>& pods) {
  std::ofstream output(path);
  output << "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n";
  for (const PodSpec& pod : pods) {
    std::string spec;
    for (const std::string& model : pod.models) spec += (spec.empty() ? "" : "|") + model;
    output << fmt::format("{},{},{},{},{},{},{}\n", pod.name, pod.cpu_milli, pod.memory_mib,
                          pod.gpus, pod.gpu_milli, spec, pod.qos);
  }
  output.close();
  if (!output) throw std::runtime_error(fmt::format("{}: cannot write", path));
}

}  // namespace tessera::sched
