// The run sidecar (include/ds4r/run_manifest.h) and SHA-256: known answers, round trip, the
// differences --resume reports, atomic writing, malformed sidecars rejected with the file named.
#include "ds4r/run_manifest.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/sha256.h"

namespace ds4r {
namespace {

std::string sha(const std::string& s) {
    Sha256 h;
    h.update(s);
    return h.hex_digest();
}

TEST(Sha256, KnownAnswers) {
    // FIPS 180-4 examples, and a message across several blocks fed in odd pieces.
    EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const std::string million(1000000, 'a');
    Sha256 h;
    for (size_t i = 0; i < million.size(); i += 997)
        h.update(million.data() + i, std::min<size_t>(997, million.size() - i));
    EXPECT_EQ(h.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    const std::string p = test::temp_dir("sha") + "/f";
    test::write_text(p, "abc");
    EXPECT_EQ(sha256_file(p), sha("abc"));
}

RunManifest sample() {
    RunManifest m;
    m.input = {"in.jsonl", sha("input"), 30};
    m.set_option("top_k", int64_t{8});
    m.set_option("capture_layers", std::vector<int>{2, 6});
    m.set_option("hidden_mode", std::string("mean"));
    m.set_option("max_seq_len", int64_t{4096});
    m.set_option("skip_bad", false);
    m.model = {sha("model"), 6, 1000};
    m.hidden.dir = "hidden";
    m.hidden.layers[2] = {"<f2", {256}};
    m.hidden.layers[6] = {"<f2", {256}};
    m.backend = "cpu";
    return m;
}

TEST(RunManifest, RoundTripsThroughItsFile) {
    const std::string dir = test::temp_dir("manifest");
    const std::string path = run_manifest_path(dir + "/out.jsonl");
    EXPECT_EQ(path, dir + "/out.jsonl.run.json");
    EXPECT_FALSE(read_run_manifest(path).has_value());
    RunManifest m = sample();
    m.shard = RunManifest::Shard{2, 4};
    write_run_manifest(path, m);
    // Atomic: no temp file is left next to it.
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
    EXPECT_EQ(files, 1);
    const auto back = read_run_manifest(path);
    ASSERT_TRUE(back.has_value());
    EXPECT_TRUE(compare_run_manifests(m, *back).empty());
    EXPECT_EQ(back->input.sha256, m.input.sha256);
    EXPECT_EQ(back->input.records, 30);
    EXPECT_EQ(back->hidden.layers.at(6).row_shape, (Shape{256}));
    EXPECT_EQ(back->backend, "cpu");
    ASSERT_TRUE(back->shard.has_value());
    EXPECT_EQ(back->shard->index, 2);
    EXPECT_EQ(back->shard->count, 4);
    // stdin: unknown hash and record count are written as null and read back as unknown.
    m.input = {"-", "", -1};
    write_run_manifest(path, m);
    const std::string text = test::slurp(path);
    EXPECT_NE(text.find("\"sha256\": null"), std::string::npos) << text;
    EXPECT_NE(text.find("\"records\": null"), std::string::npos) << text;
    EXPECT_EQ(read_run_manifest(path)->input.sha256, "");
    EXPECT_EQ(read_run_manifest(path)->input.records, -1);
}

TEST(RunManifest, DifferencesReadLikeCommandLines) {
    const RunManifest then = sample();
    RunManifest now = sample();
    EXPECT_TRUE(compare_run_manifests(now, then).empty());
    now.set_option("top_k", int64_t{3});
    now.set_option("capture_layers", std::vector<int>{3});
    now.set_option("skip_bad", true);
    now.hidden.layers.erase(2);
    auto d = compare_run_manifests(now, then);
    ASSERT_EQ(d.size(), 4u);
    EXPECT_EQ(d[0], "--capture-layers 3 but the output was written with --capture-layers 2,6");
    EXPECT_EQ(d[1], "--skip-bad but the output was written with no --skip-bad");
    EXPECT_EQ(d[2], "--top-k 3 but the output was written with --top-k 8");
    EXPECT_EQ(d[3], "hidden_L2.npy: no file but the output was written with <f2 [256] rows");

    now = sample();
    now.input = {"other.jsonl", sha("other input"), 31};
    now.model.fingerprint = sha("another model");
    now.backend = "cuda";  // informational only
    d = compare_run_manifests(now, then);
    ASSERT_EQ(d.size(), 2u);
    EXPECT_NE(d[0].find("input other.jsonl (sha256 "), std::string::npos) << d[0];
    EXPECT_NE(d[0].find("but the output was written with input in.jsonl"), std::string::npos) << d[0];
    EXPECT_NE(d[1].find("model "), std::string::npos) << d[1];

    // An unknown input hash (stdin) is not a difference; the caller reports it.
    now = sample();
    now.input = {"-", "", -1};
    EXPECT_TRUE(compare_run_manifests(now, then).empty());

    // A flag a newer version records, absent in the older sidecar.
    now = sample();
    now.set_option("echo_tokens", true);
    d = compare_run_manifests(now, then);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], "--echo-tokens but the output was written with --echo-tokens (not recorded)");
}

TEST(RunManifest, ShardsCompareEqualIgnoringTheShardOnly) {
    RunManifest a = sample(), b = sample();
    a.shard = RunManifest::Shard{0, 2};
    b.shard = RunManifest::Shard{1, 2};
    EXPECT_TRUE(compare_run_manifests_ignoring_shard(a, b).empty());
    const auto d = compare_run_manifests(a, b, "shard 1 was written with");
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0], "--shard 0/2 but shard 1 was written with --shard 1/2");
    b.set_option("top_k", int64_t{5});
    EXPECT_EQ(compare_run_manifests_ignoring_shard(a, b).size(), 1u);
}

TEST(RunManifest, MalformedSidecarsAreRejectedNamingTheFile) {
    const std::string good = run_manifest_to_json(sample());
    EXPECT_NO_THROW(parse_run_manifest(good, "x.run.json"));
    auto rejects = [](const std::string& text, const std::string& what) {
        try {
            parse_run_manifest(text, "x.run.json");
            ADD_FAILURE() << "accepted: " << text;
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find("x.run.json: "), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    rejects("not json", "invalid JSON");
    rejects("{}", "not a run sidecar");
    rejects("[1, 2]", "not a run sidecar");
    std::string newer = good;
    newer.replace(newer.find("\"version\": 1"), 12, "\"version\": 2");
    rejects(newer, "version 2");
    std::string no_model = good;
    no_model.replace(no_model.find("\"model\""), 7, "\"modelx\"");
    rejects(no_model, "malformed run sidecar");
    std::string bad_layer = good;
    bad_layer.replace(bad_layer.find("\"2\": {"), 6, "\"x\": {");
    rejects(bad_layer, "hidden layer key 'x'");
}

TEST(RunManifest, ModelFingerprintFollowsTheFilesNotTheirDirectory) {
    const std::string a = test::temp_dir("fp-a"), b = test::temp_dir("fp-b");
    for (const auto& d : {a, b}) {
        test::write_text(d + "/config.json", "{\"n\": 1}");
        test::write_text(d + "/model.safetensors.index.json", "{}");
    }
    const std::string fa = model_fingerprint(a + "/config.json", a + "/model.safetensors.index.json");
    EXPECT_EQ(fa.size(), 64u);
    EXPECT_EQ(fa, model_fingerprint(b + "/config.json", b + "/model.safetensors.index.json"));
    test::write_text(b + "/config.json", "{\"n\": 2}");
    EXPECT_NE(fa, model_fingerprint(b + "/config.json", b + "/model.safetensors.index.json"));
}

}  // namespace
}  // namespace ds4r
