// TEMPORARY placeholder while the command is being written.
#include "cli/commands.h"
#include "ds4r/error.h"

namespace ds4r::cli {

void add_inspect_command(CLI::App& root, std::vector<Command>& out) {
    Command c;
    c.app = root.add_subcommand("inspect", "(not yet available)");
    c.run = []() -> int { DS4R_THROW(RuntimeError, "'inspect' is not implemented yet"); };
    out.push_back(c);
}

}  // namespace ds4r::cli
