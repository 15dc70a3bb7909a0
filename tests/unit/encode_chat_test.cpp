// DeepSeek V4.1 chat format (src/text/chat_format.cpp) against DeepSeek's 5 official encoding cases
// (tests/data/tokenizer/chat_to_ids.jsonl: prompt string and ids), and the format's rules one by one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "encode_test_util.h"
#include "text/python_json.h"

namespace ds4r {
namespace {

using json = nlohmann::json;

// A case's input as a record: a bare message list is {"messages": [...]} (chat mode, as DeepSeek's
// test harness runs it). Key order matters (tool schemas are written in it): ordered_json.
std::string case_record(const nlohmann::ordered_json& input) {
    return input.is_array() ? nlohmann::ordered_json{{"messages", input}}.dump() : input.dump();
}

TEST(EncodeChat, OfficialCasesPromptAndIdsMatch) {
    const auto lines = test::read_lines(test::tokenizer_data_dir() + "/chat_to_ids.jsonl");
    ASSERT_EQ(lines.size(), 5u);
    for (const std::string& line : lines) {
        const auto rec = nlohmann::ordered_json::parse(line);
        const std::string id = rec.at("id").get<std::string>();
        const std::string prompt = render_chat_prompt(case_record(rec.at("input")));
        EXPECT_EQ(prompt, rec.at("expected_prompt").get<std::string>()) << id;
        EXPECT_EQ(test::v41_encoder().encode(prompt), rec.at("tokens").get<std::vector<int32_t>>()) << id;
    }
}

std::string render(const json& rec, ChatOptions opt = {}) {
    return render_chat_prompt(rec.dump(), opt);
}

const std::string kBos = "<｜begin▁of▁sentence｜>";

TEST(EncodeChat, GenerationHeaderFollowsTheLastUserMessage) {
    const json rec = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    EXPECT_EQ(render(rec), kBos + "<｜User｜>Hi<｜Assistant｜></think>");
    ChatOptions no_header;
    no_header.add_generation_prompt = false;
    EXPECT_EQ(render(rec, no_header), kBos + "<｜User｜>Hi");
    json thinking = rec;
    thinking["thinking_mode"] = "thinking";
    thinking["reasoning_effort"] = 12;
    EXPECT_EQ(render(thinking),
              kBos +
                  "<｜System｜>Reasoning Effort: 12 (range 1-100, the higher the value, the more "
                  "thorough the reasoning)\n\n<｜User｜>Hi<｜Assistant｜><think>");
}

TEST(EncodeChat, ThinkingModeDropsEarlierReasoningUnlessToolsArePresent) {
    json rec = {{"thinking_mode", "thinking"},
                {"messages",
                 {{{"role", "user"}, {"content", "a"}},
                  {{"role", "assistant"}, {"content", "b"}, {"reasoning_content", "r1"}},
                  {{"role", "user"}, {"content", "c"}},
                  {{"role", "assistant"}, {"content", "d"}, {"reasoning_content", "r2"}}}}};
    const std::string effort =
        "<｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the "
        "reasoning)\n\n";
    EXPECT_EQ(render(rec),
              kBos + effort +
                  "<｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜><｜User｜>c<｜Assistant｜><think>"
                  "r2</think>d<｜end▁of▁sentence｜>");
    rec["messages"][0]["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
    const std::string p = render(rec);
    EXPECT_NE(p.find("<think>r1</think>b"), std::string::npos) << p;
}

TEST(EncodeChat, ToolResultsAreMergedAndSortedByCallOrder) {
    const json rec = {
        {"messages",
         {{{"role", "user"}, {"content", "q"}},
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls",
            {{{"id", "x"}, {"function", {{"name", "ns::f"}, {"arguments", "{\"n\": 1, \"s\": \"t\"}"}}}},
             {{"id", "y"}, {"function", {{"name", "g"}, {"arguments", json{{"k", {1.5, true}}}}}}}}}},
          {{"role", "tool"}, {"tool_call_id", "y"}, {"content", "Y"}},
          {{"role", "tool"}, {"tool_call_id", "x"}, {"content", "X"}}}}};
    const std::string p = render(rec);
    EXPECT_NE(
        p.find(
            "<｜User｜><tool_result>X</tool_result>\n\n<tool_result>Y</tool_result><｜Assistant｜></think>"),
        std::string::npos)
        << p;
    EXPECT_NE(
        p.find(
            "<｜DSML｜ invoke name=\"ns::f\">\n<｜DSML｜ parameter name=\"n\" string=\"false\">1</｜DSML｜ "
            "parameter>\n<｜DSML｜ parameter name=\"s\" string=\"true\">t</｜DSML｜ parameter>"),
        std::string::npos)
        << p;
    EXPECT_NE(p.find("<｜DSML｜ parameter name=\"k\" string=\"false\">[1.5, true]</｜DSML｜ parameter>"),
              std::string::npos)
        << p;
}

TEST(EncodeChat, ImagesBecomeThePlaceholderToken) {
    const json rec = {{"messages",
                       {{{"role", "user"},
                         {"content",
                          {{{"type", "text"}, {"text", "see"}},
                           {{"type", "image_url"}, {"image_url", {{"url", "a.png"}}}}}}}}}};
    EXPECT_EQ(render(rec), kBos + "<｜User｜>see\n\n<｜deepseek_image｜><｜Assistant｜></think>");
    json bad = rec;
    bad["messages"][0]["content"][1]["image_url"]["url"] = "";
    EXPECT_THROW(render(bad), InputError);
    const json inline_placeholder = {
        {"messages", {{{"role", "user"}, {"content", "x<｜deepseek_image｜>"}}}}};
    EXPECT_THROW(render(inline_placeholder), InputError);
}

TEST(EncodeChat, TasksAndContext) {
    const json action = {{"messages", {{{"role", "user"}, {"content", "q"}, {"task", "action"}}}}};
    EXPECT_EQ(render(action), kBos + "<｜User｜>q<｜Assistant｜></think><｜action｜>");
    const json query = {{"messages", {{{"role", "user"}, {"content", "q"}, {"task", "query"}}}}};
    EXPECT_EQ(render(query), kBos + "<｜User｜>q<｜query｜>");
    // With a context: no BOS, only the new messages are rendered.
    const json ctx = {{"context", {{{"role", "user"}, {"content", "a"}}}},
                      {"messages", {{{"role", "assistant"}, {"content", "b"}}}}};
    EXPECT_EQ(render(ctx), "b<｜end▁of▁sentence｜>");
}

TEST(EncodeChat, BadRecordsAreInputErrors) {
    EXPECT_THROW(render_chat_prompt("{\"messages\": 3}"), InputError);
    EXPECT_THROW(render_chat_prompt("[1]"), InputError);
    EXPECT_THROW(render(json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}), InputError);
    EXPECT_THROW(
        render(json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"thinking_mode", "deep"}}),
        InputError);
    EXPECT_THROW(
        render(json{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"reasoning_effort", 101}}),
        InputError);
    EXPECT_THROW(render(json{{"messages", {{{"role", "user"}, {"content", "x"}, {"task", "nope"}}}}}),
                 InputError);
    EXPECT_THROW(render(json{{"messages", {{{"role", "user"}, {"content", {{"a", 1}}}}}}}), InputError);
}

TEST(PythonJson, DumpsLikeJsonDumpsEnsureAsciiFalse) {
    const auto oj = nlohmann::ordered_json::parse(R"({"z": 1, "a": [1.0, 0.1, 1e16, 1e-5, 123456.789, -0.0],
        "s": "é\n\"\u0001\\", "n": null, "b": false})");
    EXPECT_EQ(text::python_json_dumps(oj),
              "{\"z\": 1, \"a\": [1.0, 0.1, 1e+16, 1e-05, 123456.789, -0.0], \"s\": \"é\\n\\\"\\u0001\\\\\", "
              "\"n\": null, \"b\": false}");
    EXPECT_EQ(text::python_float_repr(1e15), "1000000000000000.0");
    EXPECT_EQ(text::python_float_repr(0.0001), "0.0001");
    EXPECT_EQ(text::python_float_repr(1.5e300), "1.5e+300");
}

}  // namespace
}  // namespace ds4r
