// DeepSeek V4.1 chat format (see ds4r/text.h): an own implementation of what encoding.py of the
// release does (encode_messages with drop_thinking=True, add_default_bos_token=True). The steps:
//  1. images: image / image_url content blocks become the image placeholder token (the picture
//     itself is not encoded: ds4replay replays text tokens only); a list `content` becomes
//     `content_blocks`, and its text blocks joined by "\n\n" the `content`;
//  2. `tool` messages become <tool_result> blocks of a user message (merged into the previous user
//     message when that one has blocks and no task); consecutive user messages merge the same way;
//  3. several tool results in one user message are put in the order of the preceding assistant's
//     tool_calls (by id);
//  4. thinking mode without tools anywhere: reasoning is dropped from assistant turns before the
//     last user (or mid-conversation system) message, and those turns get no "</think>";
//  5. each message is rendered; after a user / mid-conversation system message that the model is to
//     answer comes the generation header, `<｜Assistant｜>` + `<think>` (thinking) or `</think>`.
// Everything encoding.py rejects (asserts, exceptions) is an InputError here.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "ds4r/error.h"
#include "ds4r/text.h"
#include "text/python_json.h"

namespace ds4r {

namespace {

using oj = nlohmann::ordered_json;

const std::string kBos = "<｜begin▁of▁sentence｜>";
const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kThinkStart = "<think>";
const std::string kThinkEnd = "</think>";
const std::string kDsml = "｜DSML｜";
const std::string kUser = "<｜User｜>";
const std::string kAssistant = "<｜Assistant｜>";
const std::string kSystem = "<｜System｜>";
const std::string kLatestReminder = "<｜latest_reminder｜>";
const std::string kImage = "<｜deepseek_image｜>";

const std::map<std::string, std::string>& task_tokens() {
    static const std::map<std::string, std::string> t = {
        {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
        {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
    return t;
}

[[noreturn]] void fail(const std::string& msg) {
    throw InputError(msg);
}

// Python truthiness of a JSON value.
bool truthy(const oj& v) {
    switch (v.type()) {
        case oj::value_t::null:
            return false;
        case oj::value_t::boolean:
            return v.get<bool>();
        case oj::value_t::number_integer:
            return v.get<int64_t>() != 0;
        case oj::value_t::number_unsigned:
            return v.get<uint64_t>() != 0;
        case oj::value_t::number_float:
            return v.get<double>() != 0.0;
        case oj::value_t::string:
            return !v.get_ref<const std::string&>().empty();
        default:
            return !v.empty();
    }
}

// dict.get(key): null when absent.
const oj& get(const oj& obj, const char* key) {
    static const oj null_value;
    if (!obj.is_object()) return null_value;
    auto it = obj.find(key);
    return it == obj.end() ? null_value : *it;
}

bool is_none(const oj& obj, const char* key) {
    return get(obj, key).is_null();
}

// Python's str() of a scalar, as str.format puts it into the prompt.
std::string py_str(const oj& v, const std::string& what) {
    switch (v.type()) {
        case oj::value_t::string:
            return v.get<std::string>();
        case oj::value_t::null:
            return "None";
        case oj::value_t::boolean:
            return v.get<bool>() ? "True" : "False";
        case oj::value_t::number_integer:
        case oj::value_t::number_unsigned:
        case oj::value_t::number_float:
            return text::python_json_dumps(v);
        default:
            fail(what + " must be a string, found " + v.dump().substr(0, 60));
    }
}

// `value or ""` then str().
std::string or_empty(const oj& v, const std::string& what) {
    return truthy(v) ? py_str(v, what) : std::string();
}

bool contains(const std::string& s, const std::string& sub) {
    return s.find(sub) != std::string::npos;
}

// --- 1. images ---------------------------------------------------------------------------------

oj process_image_blocks(const oj& blocks, const std::string& where) {
    oj out = oj::array();
    for (const oj& block : blocks) {
        if (!block.is_object()) {
            out.push_back(block);
            continue;
        }
        const oj& type = get(block, "type");
        if (type == "image" || type == "image_url") {
            bool has_source = false;
            if (type == "image_url") {
                const oj& iu = get(block, "image_url");
                has_source =
                    iu.is_string() ? !iu.get_ref<const std::string&>().empty() : truthy(get(iu, "url"));
            } else {
                has_source =
                    truthy(get(block, "source")) || truthy(get(block, "url")) || truthy(get(block, "data"));
            }
            if (!has_source) fail(where + ": image block does not contain a valid source");
            out.push_back(oj{{"type", "text"}, {"text", kImage}});
        } else if (type == "tool_result" && get(block, "content").is_array()) {
            oj b = block;
            b["content"] = process_image_blocks(block.at("content"), where);
            out.push_back(std::move(b));
        } else if (type == "text") {
            const oj& t = get(block, "text");
            if (t.is_string() && contains(t.get_ref<const std::string&>(), kImage))
                fail(where + ": a text block contains the image placeholder " + kImage +
                     "; give images as separate image blocks");
            out.push_back(block);
        } else {
            out.push_back(block);
        }
    }
    return out;
}

oj process_image_messages(const oj& messages, const std::string& list_name) {
    oj out = oj::array();
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string where = list_name + "[" + std::to_string(i) + "]";
        oj msg = messages[i];
        if (!msg.is_object()) fail(where + ": a message must be a JSON object with a \"role\"");
        const oj& role = get(msg, "role");
        static const char* const kRoles[] = {"system", "user", "assistant", "tool", "latest_reminder"};
        if (!role.is_string() ||
            std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* r) { return role == r; }))
            fail(where + ": \"role\" must be one of system, user, assistant, tool, latest_reminder, found " +
                 role.dump().substr(0, 40));
        for (const char* k : {"content", "reasoning_content"}) {
            const oj& v = get(msg, k);
            if (v.is_string() && contains(v.get_ref<const std::string&>(), kImage))
                fail(where + ": \"" + k + "\" contains the image placeholder " + kImage +
                     "; give images as image content blocks");
        }
        if (get(msg, "content").is_array() && !msg.contains("content_blocks")) {
            msg["content_blocks"] = msg["content"];
            msg.erase("content");
        }
        if (truthy(get(msg, "content_blocks"))) {
            if (!msg["content_blocks"].is_array()) fail(where + ": \"content_blocks\" must be an array");
            msg["content_blocks"] = process_image_blocks(msg["content_blocks"], where);
            if (!get(msg, "content").is_string()) {
                std::string joined;
                bool first = true;
                for (const oj& b : msg["content_blocks"]) {
                    if (!b.is_object() || get(b, "type") != "text") continue;
                    if (!first) joined += "\n\n";
                    first = false;
                    joined += or_empty(get(b, "text"), where + ": a text block's \"text\"");
                }
                msg["content"] = joined;
            }
        }
        out.push_back(std::move(msg));
    }
    return out;
}

// --- 2. / 3. tool results ----------------------------------------------------------------------

oj merge_tool_messages(const oj& messages) {
    oj merged = oj::array();
    auto last_is_user_with_blocks = [&]() {
        return !merged.empty() && get(merged.back(), "role") == "user" &&
               merged.back().contains("content_blocks");
    };
    for (const oj& msg : messages) {
        const oj& role = get(msg, "role");
        if (role == "tool") {
            oj block = {{"type", "tool_result"},
                        {"tool_use_id", msg.contains("tool_call_id") ? msg.at("tool_call_id") : oj("")},
                        {"content", msg.contains("content") ? msg.at("content") : oj("")}};
            if (last_is_user_with_blocks()) {
                if (!merged.back()["content_blocks"].is_array()) fail("\"content_blocks\" must be an array");
                merged.back()["content_blocks"].push_back(std::move(block));
            } else {
                merged.push_back(oj{{"role", "user"}, {"content_blocks", oj::array({std::move(block)})}});
            }
        } else if (role == "user") {
            oj blocks = get(msg, "content_blocks");
            if (blocks.is_null())
                blocks = oj::array(
                    {oj{{"type", "text"}, {"text", msg.contains("content") ? msg.at("content") : oj("")}}});
            if (!blocks.is_array()) fail("\"content_blocks\" must be an array");
            if (last_is_user_with_blocks() && is_none(merged.back(), "task")) {
                for (const oj& b : blocks) merged.back()["content_blocks"].push_back(b);
            } else {
                oj m = msg;
                m["content_blocks"] = std::move(blocks);
                merged.push_back(std::move(m));
            }
        } else {
            merged.push_back(msg);
        }
    }
    return merged;
}

// The tool-call order of the latest assistant message with tool calls: id (as JSON text) -> index.
using CallOrder = std::map<std::string, int64_t>;

void sort_tool_results(oj& messages, CallOrder& order) {
    for (oj& msg : messages) {
        const oj& role = get(msg, "role");
        if (role == "assistant" && truthy(get(msg, "tool_calls"))) {
            if (!msg["tool_calls"].is_array()) fail("\"tool_calls\" must be an array");
            order.clear();
            int64_t idx = 0;
            for (const oj& tc : msg["tool_calls"]) {
                oj id = get(tc, "id");
                if (!truthy(id)) id = get(get(tc, "function"), "id");
                if (truthy(id)) order[id.dump()] = idx;
                ++idx;
            }
        } else if (role == "user" && truthy(get(msg, "content_blocks"))) {
            oj& blocks = msg["content_blocks"];
            std::vector<oj> tool_blocks;
            for (const oj& b : blocks)
                if (get(b, "type") == "tool_result") tool_blocks.push_back(b);
            if (tool_blocks.size() < 2 || order.empty()) continue;
            auto key = [&](const oj& b) {
                const oj& id = b.contains("tool_use_id") ? b.at("tool_use_id") : oj("");
                auto it = order.find(id.dump());
                return it == order.end() ? int64_t{0} : it->second;
            };
            std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                             [&](const oj& a, const oj& b) { return key(a) < key(b); });
            size_t k = 0;
            for (oj& b : blocks)
                if (get(b, "type") == "tool_result") b = tool_blocks[k++];
        }
    }
}

// --- tools and tool calls ------------------------------------------------------------------------

struct ToolName {
    std::optional<std::string> ns;
    std::string name;
    std::string qualified() const { return ns ? *ns + "::" + name : name; }
};

// Splits "ns::name" and checks it against an explicit namespace (encoding.py's _split_tool_name).
ToolName split_tool_name(const oj& name_v, const oj& ns_v, const std::string& where) {
    if (!name_v.is_string()) fail(where + ": the tool \"name\" must be a string");
    std::optional<std::string> ns;
    if (ns_v.is_object()) {
        if (!get(ns_v, "name").is_string()) fail(where + ": a namespace object needs a string \"name\"");
        ns = ns_v.at("name").get<std::string>();
    } else if (ns_v.is_string()) {
        ns = ns_v.get<std::string>();
    } else if (!ns_v.is_null()) {
        fail(where + ": \"namespace\" must be a string or an object with a \"name\"");
    }
    std::string name = name_v.get<std::string>();
    const size_t sep = name.find("::");
    if (sep != std::string::npos) {
        const std::string prefix = name.substr(0, sep);
        if (ns && *ns != prefix) fail(where + ": conflicting tool namespaces: " + *ns + " != " + prefix);
        ns = prefix;
        name = name.substr(sep + 2);
    }
    if (contains(name, "::")) fail(where + ": tool name must not contain '::': " + name);
    if (ns && contains(*ns, "::")) fail(where + ": tool namespace must not contain '::': " + *ns);
    return {ns, name};
}

// tools_from_openai_format: the function objects with namespace-qualified names.
std::vector<oj> tool_functions(const oj& tools, const std::string& where) {
    if (!tools.is_array()) fail(where + ": \"tools\" must be an array");
    std::vector<oj> out;
    for (const oj& tool : tools) {
        if (!get(tool, "function").is_object())
            fail(where +
                 ": each tool needs a \"function\" object ({\"type\": \"function\", \"function\": {...}})");
        oj f = tool.at("function");
        if (!is_none(tool, "namespace")) f["namespace"] = tool.at("namespace");
        const oj ns = get(f, "namespace");
        f["name"] = split_tool_name(get(f, "name"), ns, where).qualified();
        f.erase("namespace");
        if (ns.is_object() && truthy(get(ns, "description"))) {
            if (!ns.at("description").is_string())
                fail(where + ": a namespace \"description\" must be a string");
            f["description"] = ns.at("description").get<std::string>() + "\n" +
                               or_empty(get(f, "description"), where + ": \"description\"");
        }
        out.push_back(std::move(f));
    }
    return out;
}

std::string render_tools(const std::vector<oj>& functions) {
    std::string schemas;
    for (size_t i = 0; i < functions.size(); ++i) {
        if (i) schemas += "\n";
        schemas += text::python_json_dumps(functions[i]);
    }
    const std::string calls = "<" + kDsml + " calls>", calls_end = "</" + kDsml + " calls>";
    const std::string invoke = "<" + kDsml + " invoke", invoke_end = "</" + kDsml + " invoke>";
    const std::string param = "<" + kDsml + " parameter", param_end = "</" + kDsml + " parameter>";
    return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
           "tools "
           "by writing a \"" +
           calls + "\" block like the following:\n\n" + calls + "\n" + invoke + " name=\"$TOOL_NAME\">\n" +
           param + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" + param_end +
           "\n...\n" + invoke_end + "\n" + invoke + " name=\"$TOOL_NAME2\">\n...\n" + invoke_end + "\n" +
           calls_end +
           "\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types "
           "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
           "`string=\"false\"`.\n\n"
           "If thinking_mode is enabled (triggered by " +
           kThinkStart + "), you MUST output your complete reasoning inside " + kThinkStart + "..." +
           kThinkEnd + " BEFORE any tool calls or final response.\n\nOtherwise, output directly after " +
           kThinkEnd + " with tool calls or final response.\n\n### Available Tool Schemas\n\n" + schemas +
           "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
           "calls.\n";
}

// One tool call in DSML: its name and its arguments as parameters (encode_arguments_to_dsml).
std::string render_tool_call(const oj& tc, const std::string& where) {
    if (!get(tc, "function").is_object()) fail(where + ": each tool call needs a \"function\" object");
    const oj& fn = tc.at("function");
    const oj& ns = truthy(get(tc, "namespace")) ? tc.at("namespace") : get(fn, "namespace");
    const ToolName tn = split_tool_name(get(fn, "name"), ns, where);
    if (!fn.contains("arguments")) fail(where + ": a tool call's function has no \"arguments\"");
    const oj& original = fn.at("arguments");
    oj args = original;
    // Arguments as a JSON string (also double-encoded) are parsed; anything else that is not an
    // object becomes one parameter "arguments".
    for (int k = 0; k < 2 && args.is_string(); ++k) {
        if (json_nesting_depth(args.get_ref<const std::string&>()) > text::kMaxJsonNesting)
            fail(where + strfmt(": tool call arguments nested deeper than %d levels", text::kMaxJsonNesting));
        oj parsed = oj::parse(args.get_ref<const std::string&>(), nullptr, false);
        if (parsed.is_discarded()) break;
        args = std::move(parsed);
    }
    if (!args.is_object()) args = oj{{"arguments", original}};
    std::string params;
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
        if (!first) params += "\n";
        first = false;
        const bool is_str = it.value().is_string();
        params += "<" + kDsml + " parameter name=\"" + it.key() + "\" string=\"" +
                  (is_str ? "true" : "false") + "\">" +
                  (is_str ? it.value().get<std::string>() : text::python_json_dumps(it.value())) + "</" +
                  kDsml + " parameter>";
    }
    return "<" + kDsml + " invoke name=\"" + tn.qualified() + "\">\n" + params + "\n</" + kDsml + " invoke>";
}

// --- 4. / 5. rendering ---------------------------------------------------------------------------

// Index of the last user message, or of a system message after the first (V4.1: they count as
// user turns), or -1.
int64_t last_user_index(const oj& msgs) {
    for (int64_t i = static_cast<int64_t>(msgs.size()) - 1; i >= 0; --i) {
        const oj& role = get(msgs[static_cast<size_t>(i)], "role");
        if (role == "user" || (role == "system" && i > 0)) return i;
    }
    return -1;
}

// "Reasoning Effort: N" budget: an int in [1, 100] or low / high / max (default high).
int reasoning_budget(const oj& effort) {
    if (effort.is_null()) return 75;
    if (effort.is_number_integer() || effort.is_number_unsigned()) {
        const int64_t v = effort.is_number_unsigned()
                              ? static_cast<int64_t>(std::min<uint64_t>(effort.get<uint64_t>(), 1000))
                              : effort.get<int64_t>();
        if (v >= 1 && v <= 100) return static_cast<int>(v);
    } else if (effort == "low") {
        return 50;
    } else if (effort == "high") {
        return 75;
    } else if (effort == "max") {
        return 100;
    }
    fail("\"reasoning_effort\" must be an integer in [1, 100] or one of \"low\", \"high\", \"max\", found " +
         effort.dump().substr(0, 40));
}

struct RenderState {
    const oj& msgs;
    bool thinking;
    bool drop_thinking;
    int budget;
    bool add_generation_prompt;
    int64_t last_user;
};

std::string render_user_blocks(const oj& blocks, const std::string& where) {
    std::string out;
    bool first = true;
    for (const oj& block : blocks) {
        if (!first) out += "\n\n";
        first = false;
        const oj& type = get(block, "type");
        if (type == "text") {
            out += or_empty(get(block, "text"), where + ": a text block's \"text\"");
        } else if (type == "tool_result") {
            const oj& c = get(block, "content");
            std::string content;
            if (c.is_array()) {
                bool f2 = true;
                for (const oj& b : c) {
                    if (!f2) content += "\n\n";
                    f2 = false;
                    const oj& t = get(b, "type");
                    if (t == "text")
                        content += or_empty(get(b, "text"), where + ": a text block's \"text\"");
                    else
                        content += "[Unsupported " + py_str(t, where + ": a block's \"type\"") + "]";
                }
            } else {
                content = py_str(c, where + ": a tool result's \"content\"");
            }
            out += "<tool_result>" + content + "</tool_result>";
        } else {
            out += "[Unsupported " + py_str(type, where + ": a block's \"type\"") + "]";
        }
    }
    return out;
}

std::string render_message(size_t index, const RenderState& st) {
    const oj& msg = st.msgs[index];
    const std::string where = "messages[" + std::to_string(index) + "]";
    const std::string role = get(msg, "role").get<std::string>();
    const oj& content = get(msg, "content");

    std::string prompt;
    // Thinking mode: the conversation opens with the reasoning-effort line in a system turn.
    const bool effort_line = index == 0 && st.thinking;
    if (index == 0 && (effort_line || role == "system")) prompt += kSystem;
    if (effort_line)
        prompt += "Reasoning Effort: " + std::to_string(st.budget) +
                  " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

    if (role == "system") {
        if (index > 0) prompt += kSystem;  // a mid-conversation system message
        prompt += or_empty(content, where + ": \"content\"");
        if (truthy(get(msg, "tools")))
            prompt += "\n\n" + render_tools(tool_functions(msg.at("tools"), where));
        if (truthy(get(msg, "response_format")))
            prompt +=
                "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
                text::python_json_dumps(msg.at("response_format"));
    } else if (role == "user") {
        prompt += kUser;
        if (truthy(get(msg, "content_blocks")))
            prompt += render_user_blocks(msg.at("content_blocks"), where);
        else
            prompt += or_empty(content, where + ": \"content\"");
    } else if (role == "latest_reminder") {
        prompt += kLatestReminder + py_str(content, where + ": \"content\"");
    } else {  // assistant
        std::string calls;
        if (truthy(get(msg, "tool_calls"))) {
            if (!msg.at("tool_calls").is_array()) fail(where + ": \"tool_calls\" must be an array");
            calls = "\n\n<" + kDsml + " calls>\n";
            bool first = true;
            for (const oj& tc : msg.at("tool_calls")) {
                if (!first) calls += "\n";
                first = false;
                calls += render_tool_call(tc, where);
            }
            calls += "\n</" + kDsml + " calls>";
        }
        // The answer to a task carries no reasoning.
        const bool prev_has_task = index > 0 && !is_none(st.msgs[index - 1], "task");
        std::string reasoning;
        if (st.thinking && !prev_has_task &&
            (!st.drop_thinking || static_cast<int64_t>(index) > st.last_user))
            reasoning =
                or_empty(get(msg, "reasoning_content"), where + ": \"reasoning_content\"") + kThinkEnd;
        prompt += reasoning + or_empty(content, where + ": \"content\"") + calls;
        if (!truthy(get(msg, "wo_eos"))) prompt += kEos;
    }

    // What follows: nothing when the next message is not the model's (assistant / reminder).
    if (index + 1 < st.msgs.size()) {
        const oj& next_role = get(st.msgs[index + 1], "role");
        if (next_role != "assistant" && next_role != "latest_reminder") return prompt;
    }
    const bool last = index + 1 == st.msgs.size();
    const oj& task = get(msg, "task");
    if (!task.is_null()) {
        const auto it = task.is_string() ? task_tokens().find(task.get<std::string>()) : task_tokens().end();
        if (it == task_tokens().end())
            fail(where + ": invalid \"task\" " + task.dump().substr(0, 40) +
                 " (valid: action, query, authority, domain, title, read_url)");
        if (last && !st.add_generation_prompt) return prompt;
        if (it->first != "action")
            prompt += it->second;
        else
            prompt += kAssistant + (st.thinking ? kThinkStart : kThinkEnd) + it->second;
    } else if (role == "user" || (role == "system" && index > 0)) {
        if (last && !st.add_generation_prompt) return prompt;
        prompt += kAssistant;
        const bool think = st.thinking && (!st.drop_thinking || static_cast<int64_t>(index) >= st.last_user);
        prompt += think ? kThinkStart : kThinkEnd;
    }
    return prompt;
}

}  // namespace

std::string render_chat_prompt(std::string_view record_json, const ChatOptions& opt) {
    if (json_nesting_depth(record_json) > text::kMaxJsonNesting)
        fail(strfmt("JSON nested deeper than %d levels", text::kMaxJsonNesting));
    oj rec = oj::parse(record_json.begin(), record_json.end(), nullptr, false);
    if (rec.is_discarded()) fail("not valid JSON");
    if (!rec.is_object()) fail("a chat record must be a JSON object with \"messages\"");
    if (!get(rec, "messages").is_array())
        fail("\"messages\" must be an array of {\"role\": ..., \"content\": ...} objects");
    oj messages = rec.at("messages");
    if (rec.contains("tools") && !rec.at("tools").is_null()) {
        if (messages.empty()) fail("a record with \"tools\" must have at least one message");
        if (!messages[0].is_object()) fail("messages[0]: a message must be a JSON object with a \"role\"");
        messages[0]["tools"] = rec.at("tools");
    }
    const oj& mode = get(rec, "thinking_mode");
    std::string thinking_mode = opt.default_thinking_mode;
    if (truthy(mode)) {
        if (!mode.is_string()) fail("\"thinking_mode\" must be \"chat\" or \"thinking\"");
        thinking_mode = mode.get<std::string>();
    }
    if (thinking_mode != "chat" && thinking_mode != "thinking")
        fail("\"thinking_mode\" must be \"chat\" or \"thinking\", found \"" + thinking_mode + "\"");
    const oj& ctx_v = get(rec, "context");
    if (!ctx_v.is_null() && !ctx_v.is_array()) fail("\"context\" must be an array of messages");
    const int budget = reasoning_budget(get(rec, "reasoning_effort"));

    const oj context = truthy(ctx_v) ? process_image_messages(ctx_v, "context") : oj::array();
    messages = merge_tool_messages(process_image_messages(messages, "messages"));
    oj merged_context = merge_tool_messages(context);
    CallOrder order;
    sort_tool_results(merged_context, order);
    sort_tool_results(messages, order);

    oj full = merged_context;
    for (const oj& m : messages) full.push_back(m);
    bool drop_thinking = true;
    for (const oj& m : full)
        if (truthy(get(m, "tools"))) drop_thinking = false;  // tools anywhere: reasoning is kept
    const bool thinking = thinking_mode == "thinking";
    const int64_t last_user = last_user_index(full);
    if (thinking && drop_thinking)
        for (int64_t i = 0; i < last_user; ++i) {
            oj& m = full[static_cast<size_t>(i)];
            if (get(m, "role") == "assistant") m.erase("reasoning_content");
        }

    std::string prompt = merged_context.empty() ? kBos : std::string();
    RenderState st{full, thinking, drop_thinking, budget, opt.add_generation_prompt, last_user};
    for (size_t i = merged_context.size(); i < full.size(); ++i) prompt += render_message(i, st);
    return prompt;
}

}  // namespace ds4r
