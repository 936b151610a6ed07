#include "apps/console_log.hpp"

#include <memory>
#include <string>
#include <utility>

#include <spdlog/sinks/sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace sg::app {
namespace {

// Passes on only the lines below a level (spdlog's sinks filter from a level
// up, not below one).
class BelowLevelSink final : public spdlog::sinks::sink {
 public:
  BelowLevelSink(std::shared_ptr<spdlog::sinks::sink> inner, spdlog::level::level_enum below)
      : inner_(std::move(inner)), below_(below) {}
  void log(const spdlog::details::log_msg& msg) override {
    if (msg.level < below_) inner_->log(msg);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  std::shared_ptr<spdlog::sinks::sink> inner_;
  spdlog::level::level_enum below_;
};

}  // namespace

void use_console_log(bool every_line_to_stderr) {
  auto to_stderr = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  std::shared_ptr<spdlog::logger> logger;
  if (every_line_to_stderr) {
    logger = std::make_shared<spdlog::logger>("", to_stderr);
  } else {
    to_stderr->set_level(spdlog::level::warn);
    auto to_stdout =
        std::make_shared<BelowLevelSink>(std::make_shared<spdlog::sinks::stdout_color_sink_mt>(), spdlog::level::warn);
    logger = std::make_shared<spdlog::logger>("", spdlog::sinks_init_list{to_stdout, to_stderr});
  }
  // The default logger's name is empty: its lines keep the format "[time] [level] text".
  logger->set_level(spdlog::get_level());
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace sg::app
