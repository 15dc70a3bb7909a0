// `ds4replay encode`: CLI11 glue for run_encode (src/text/encode_command.cpp).
#include "cli/commands.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/text.h"

namespace ds4r::cli {

namespace {

// --tokenizer FILE, else --model DIR's tokenizer.json, else the default model directory's.
std::string tokenizer_file(const std::string& tokenizer, const std::string& model) {
    if (!tokenizer.empty()) return tokenizer;
    return path_join(model.empty() ? default_model_dir() : model, "tokenizer.json");
}

// The input (an argument or --input, not both differing) and the tokenizer file of encode / decode.
template <class Args>
void resolve_input_and_tokenizer(const char* cmd, Args& a) {
    if (!a.positional.empty()) {
        if (a.opt.input != "-" && a.opt.input != a.positional)
            throw InputError(std::string(cmd) +
                             ": give the input either as an argument or with --input, not both");
        a.opt.input = a.positional;
    }
    a.opt.tokenizer_path = tokenizer_file(a.opt.tokenizer_path, a.model);
}

}  // namespace

void add_encode_command(CLI::App& root, std::vector<Command>& out) {
    struct Args {
        EncodeCommandOptions opt;
        std::string model, positional;
        bool thinking = false;
    };
    auto a = std::make_shared<Args>();
    CLI::App* app = root.add_subcommand(
        "encode",
        "Texts and DeepSeek V4.1 chats (JSONL) -> token ids (JSONL for `score --input -`): "
        "{\"id\",\"text\"} or "
        "{\"id\",\"messages\",\"tools\"?,\"thinking_mode\"?,\"reasoning_effort\"?,\"context\"?}");
    app->add_option("input_file", a->positional, "Input JSONL (same as --input; default stdin)");
    app->add_option("--input", a->opt.input, "Input JSONL, - for stdin");
    app->add_option("-o,--output", a->opt.output,
                    "Output JSONL, - for stdout (an existing file is not replaced)");
    app->add_option("--model", a->model, "Model directory (its tokenizer.json)");
    app->add_option("--tokenizer", a->opt.tokenizer_path, "tokenizer.json (instead of --model)");
    app->add_flag(
        "--add-generation-prompt,!--no-add-generation-prompt", a->opt.chat.add_generation_prompt,
        "Chats: end with the header DeepSeek's encoder appends when the model is to answer the last "
        "(user / system) message: <｜Assistant｜> + <think> or </think> (default on)");
    app->add_flag("--with-text", a->opt.with_text, "Add \"token_text\": the text of each token");
    Command c;
    c.app = app;
    c.run = [a]() {
        resolve_input_and_tokenizer("encode", *a);
        return run_encode(a->opt);
    };
    out.push_back(c);
}

void add_decode_command(CLI::App& root, std::vector<Command>& out) {
    struct Args {
        EncodeCommandOptions opt;
        std::string model, positional;
    };
    auto a = std::make_shared<Args>();
    CLI::App* app = root.add_subcommand(
        "decode",
        "Token ids (JSONL records with \"tokens\") -> the same records plus \"text\" (inverse of encode)");
    app->add_option("input_file", a->positional, "Input JSONL (same as --input; default stdin)");
    app->add_option("--input", a->opt.input, "Input JSONL, - for stdin");
    app->add_option("-o,--output", a->opt.output,
                    "Output JSONL, - for stdout (an existing file is not replaced)");
    app->add_option("--model", a->model, "Model directory (its tokenizer.json)");
    app->add_option("--tokenizer", a->opt.tokenizer_path, "tokenizer.json (instead of --model)");
    app->add_flag("--with-text", a->opt.with_text, "Also add \"token_text\": the text of each token");
    Command c;
    c.app = app;
    c.run = [a]() {
        resolve_input_and_tokenizer("decode", *a);
        return run_decode(a->opt);
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
