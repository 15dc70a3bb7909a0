// `ds4replay encode` / `ds4replay decode` through the binary: JSONL records in and out, carried
// fields, --with-text, the round trip, the pipeline into `score` on the tiny checkpoint, and bad input
// (exit 2, file:line in the message).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_run_util.h"
#include "encode_test_util.h"

namespace ds4r {
namespace {

using json = nlohmann::json;
using test::shell_quote;
using test::slurp;
using test::split_lines;
using test::write_text;

std::string tok_arg() {
    return " --tokenizer " + shell_quote(test::v41_tokenizer_json_path());
}

TEST(EncodeCli, TextAndChatRecordsBecomeTokenRecords) {
    const std::string dir = test::temp_dir("encode-cli");
    const auto chats = test::read_lines(test::tokenizer_data_dir() + "/chat_to_ids.jsonl");
    const json chat_case = json::parse(chats[1]);  // official-2: a bare message list
    std::string in = R"({"id": "t1", "text": "Hello, world!", "note": {"k": [1, 2]}})"
                     "\n\n";
    in += json{{"id", 7}, {"messages", chat_case.at("input")}}.dump() + "\n";
    write_text(dir + "/in.jsonl", in);
    std::string log;
    ASSERT_EQ(test::run_ds4replay("encode" + tok_arg() + " --with-text " + shell_quote(dir + "/in.jsonl") +
                                      " --output " + shell_quote(dir + "/out.jsonl"),
                                  &log),
              0)
        << log;
    const auto lines = split_lines(slurp(dir + "/out.jsonl"));
    ASSERT_EQ(lines.size(), 2u);
    const json a = json::parse(lines[0]), b = json::parse(lines[1]);
    EXPECT_EQ(a.at("id"), "t1");
    EXPECT_EQ(a.at("note"), json::parse(R"({"k": [1, 2]})"));
    EXPECT_EQ(a.at("tokens"), json(test::v41_encoder().encode("Hello, world!")));
    std::string joined;
    for (const auto& t : a.at("token_text")) joined += t.get<std::string>();
    EXPECT_EQ(joined, "Hello, world!");
    EXPECT_FALSE(a.contains("text"));
    EXPECT_EQ(b.at("id"), 7);
    EXPECT_EQ(b.at("tokens"), chat_case.at("tokens"));

    // decode: the inverse.
    ASSERT_EQ(test::run_ds4replay("decode" + tok_arg() + " --input " + shell_quote(dir + "/out.jsonl") +
                                      " --output " + shell_quote(dir + "/dec.jsonl"),
                                  &log),
              0)
        << log;
    const auto dec = split_lines(slurp(dir + "/dec.jsonl"));
    ASSERT_EQ(dec.size(), 2u);
    EXPECT_EQ(json::parse(dec[0]).at("text"), "Hello, world!");
    EXPECT_EQ(json::parse(dec[1]).at("text"), chat_case.at("expected_prompt"));
    // An existing output is never replaced.
    EXPECT_EQ(test::run_ds4replay("decode" + tok_arg() + " --input " + shell_quote(dir + "/out.jsonl") +
                                      " --output " + shell_quote(dir + "/dec.jsonl"),
                                  &log),
              2)
        << log;
}

TEST(EncodeCli, NoGenerationPromptLeavesTheHeaderOut) {
    const std::string dir = test::temp_dir("encode-cli-gen");
    write_text(dir + "/in.jsonl", R"({"id": "c", "messages": [{"role": "user", "content": "Hi"}]})"
                                  "\n");
    const std::pair<std::string, std::string> runs[] = {
        {"", "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"},
        {"--no-add-generation-prompt", "<｜begin▁of▁sentence｜><｜User｜>Hi"}};
    int k = 0;
    for (const auto& [flag, want] : runs) {
        const std::string out = dir + "/o" + std::to_string(k++) + ".jsonl";
        std::string log;
        ASSERT_EQ(test::run_ds4replay("encode " + flag + tok_arg() + " " + shell_quote(dir + "/in.jsonl") +
                                          " --output " + shell_quote(out),
                                      &log),
                  0)
            << log;
        const json rec = json::parse(split_lines(slurp(out)).at(0));
        EXPECT_EQ(test::v41_tokenizer().decode(rec.at("tokens").get<std::vector<int32_t>>()), want);
    }
}

TEST(EncodeCli, BadLinesExitTwoNamingFileAndLine) {
    const std::string dir = test::temp_dir("encode-cli-bad");
    struct Case {
        std::string line, expect;
    } cases[] = {
        {"{\"id\": 1, \"text\": 5}", "\"text\" must be a string"},
        {"{\"id\": 1}", "expected exactly one of"},
        {"not json", "not valid JSON"},
        {"{\"id\": [1], \"text\": \"a\"}", "\"id\" must be a string or an integer"},
        {"{\"messages\": [{\"role\": \"robot\"}]}", "\"role\" must be one of"},
        {"{\"tokens\": [1, -1]}", "token 1 is -1"},
    };
    for (const Case& c : cases) {
        write_text(dir + "/in.jsonl", "{\"text\": \"ok\"}\n" + c.line + "\n");
        std::string log;
        EXPECT_EQ(test::run_ds4replay("encode" + tok_arg() + " " + shell_quote(dir + "/in.jsonl"), &log), 2)
            << c.line;
        EXPECT_NE(log.find(dir + "/in.jsonl:2: "), std::string::npos) << log;
        EXPECT_NE(log.find(c.expect), std::string::npos) << log;
    }
}

TEST(EncodeCli, PipesIntoScoreOnTheTinyCheckpoint) {
    const std::string dir = test::temp_dir("encode-cli-score");
    write_text(
        dir + "/in.jsonl",
        R"({"id": "s", "text": "Hello world, the quick brown fox."})"
        "\n"
        R"({"id": "c", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})"
        "\n");
    const std::string model = shell_quote(test::tiny_model_dir());
    std::string log;
    ASSERT_EQ(test::run_ds4replay("encode --model " + model + " " + shell_quote(dir + "/in.jsonl") + " | " +
                                      shell_quote(test::binary_path()) + " score --model " + model +
                                      " --backend cpu --progress none --input - --output " +
                                      shell_quote(dir + "/r.jsonl"),
                                  &log),
              0)
        << log;
    const auto lines = split_lines(slurp(dir + "/r.jsonl"));
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_EQ(json::parse(lines[0]).at("id"), "s");
    EXPECT_TRUE(json::parse(lines[1]).contains("logprob"));
}

}  // namespace
}  // namespace ds4r
