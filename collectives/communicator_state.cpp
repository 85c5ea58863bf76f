// CommunicatorState (collectives/communicator_state.h): makes a Communicator's objects and
// writes and reads the checkpoint that spans three of them.
#include "collectives/communicator_state.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "collectives/checkpoint.h"
#include "gradzip/error.h"
#include "kernels/tunables.h"

namespace gradzip::collectives {

namespace {

// GRADZIP_COMPRESSOR when it is set (to anything, its default "none" included, so that it can
// switch compression off), else the options' default. Presence is asked of the environment
// directly because kernels/tunables.h reports values only, not whether a variable is set.
CompressionSpec resolve_default_spec(const CommunicatorOptions& options) {
  const bool from_environment = std::getenv("GRADZIP_COMPRESSOR") != nullptr;
  const std::string text = from_environment ? kernels::tunable_value("GRADZIP_COMPRESSOR")
                                            : options.default_spec;
  try {
    return CompressionSpec::parse(text);
  } catch (const Error& error) {
    GZ_THROW(error.code(), "Communicator: the default spec '", text, "' from ",
             from_environment ? "GRADZIP_COMPRESSOR" : "CommunicatorOptions::default_spec",
             " does not parse: ", error.what());
  }
}

}  // namespace

CommunicatorState::CommunicatorState(std::unique_ptr<Transport> transport, CommunicatorOptions options)
    : transports_(std::move(transport), options),
      default_spec_(resolve_default_spec(options)),
      residuals_(static_cast<std::uint32_t>(transports_.world().size()),
                 static_cast<std::uint32_t>(transports_.world().rank()), ResizePolicy::error),
      names_(residuals_, options.release_unused_after_calls, transports_.world().rank()),
      auto_model_(transports_, codecs_, options) {}

void CommunicatorState::save_checkpoint(const std::string& path) const {
  CommunicatorCheckpoint checkpoint;
  checkpoint.call_numbers = names_.call_numbers();
  checkpoint.auto_model = auto_model_.inputs();
  save_communicator_checkpoint(path, residuals_, checkpoint);
}

void CommunicatorState::load_checkpoint(const std::string& path) {
  const CommunicatorCheckpoint checkpoint = load_communicator_checkpoint(path, residuals_);
  auto_model_.adopt(checkpoint.auto_model);
  names_.replace_call_numbers(checkpoint.call_numbers);
}

Communicator make_communicator(std::unique_ptr<Transport> transport, CommunicatorOptions options) {
  return CommunicatorAccess::wrap(
      std::make_unique<CommunicatorState>(std::move(transport), std::move(options)));
}

}  // namespace gradzip::collectives
