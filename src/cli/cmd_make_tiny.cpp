// TEMPORARY placeholder while the command is being written.
#include "cli/commands.h"
#include "ds4r/error.h"

namespace ds4r::cli {

void add_make_tiny_command(CLI::App& root, std::vector<Command>& out) {
    Command c;
    c.app = root.add_subcommand("make-tiny", "(not yet available)");
    c.run = []() -> int { DS4R_THROW(RuntimeError, "'make-tiny' is not implemented yet"); };
    out.push_back(c);
}

}  // namespace ds4r::cli
