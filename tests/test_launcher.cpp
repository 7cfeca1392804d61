// Unit tests of the launcher: the config schema, YAML parsing, typed overrides, unknown-key
// suggestions, bad values, the run-directory rules, the registries, the tg command's line (help,
// --version, errors) and agreement between ranks. The trainer (checkpoints, resume, precision,
// training over devices) is test_trainer.cpp's; what a run leaves behind (run.json, logs,
// TensorBoard files) is test_run_record.cpp's.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <new>
#include <sstream>

#include "distributed/local_backend.h"
#include "launcher/config.h"
#include "launcher/launch.h"
#include "launcher/log.h"
#include "launcher/metric_sinks.h"
#include "launcher/rank_agreement.h"
#include "launcher/registry.h"
#include "launcher/run.h"
#include "launcher/run_record.h"
#include "launcher/tensorboard.h"
#include "launcher/trainer.h"
#include "tinygrad/error.h"
#include "tinygrad/nn/layers.h"
#include "tinygrad/nn/state.h"
#include "tests/run_util.h"
#include "tests/launcher_models.h"

namespace fs = std::filesystem;
using namespace tg;
using namespace tg::launcher;
using testutil::CliRun;
using testutil::tg_run;

namespace {

// The message of the tg::Error that f throws ("" when it does not throw).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tg_test_launcher_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

}  // namespace

TEST(LauncherConfig, DefaultsAreTyped) {
  Config c;
  EXPECT_EQ(c.get_string("model.name"), "mlp");
  EXPECT_EQ(c.get_ints("model.hidden"), std::vector<int64_t>{256});
  EXPECT_EQ(c.get_int("data.batch_size"), 128);
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 1e-3);
  EXPECT_TRUE(c.get_bool("data.shuffle"));
  EXPECT_NO_THROW(c.validate());
  EXPECT_NE(error_of([&] { c.get_int("optim.lr"); }).find("optim.lr is a float, not a int"), std::string::npos);
  // Every default matches its declared type.
  for (const auto& f : config_schema()) EXPECT_EQ(f.default_value.index(), static_cast<size_t>(f.type)) << f.key;
}

TEST(LauncherConfig, ParsesYamlSections) {
  Config c = parse_config(
      "model: {name: mlp, hidden: [128, 64]}\n"
      "data:\n  batch_size: 32\n  shuffle: no\n"
      "optim:\n  name: sgd\n  lr: 0.05\n  momentum: 0.9\n  nesterov: true\n"
      "train:\n  steps: 10\n",
      "test.yaml");
  EXPECT_EQ(c.get_ints("model.hidden"), (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(c.get_int("data.batch_size"), 32);
  EXPECT_FALSE(c.get_bool("data.shuffle"));
  EXPECT_EQ(c.get_string("optim.name"), "sgd");
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 0.05);
  EXPECT_TRUE(c.get_bool("optim.nesterov"));
  EXPECT_EQ(c.get_int("train.steps"), 10);
  EXPECT_EQ(c.get_int("train.epochs"), 1);  // untouched keys keep their defaults
  EXPECT_NO_THROW(parse_config("", "empty.yaml"));
}

TEST(LauncherConfig, TypedOverrides) {
  Config c = parse_config("optim: {lr: 0.1}\n", "t.yaml",
                          {"optim.lr=0.01", "data.shuffle=false", "model.hidden=[32, 16, 8]", "train.steps=7",
                           "train.run_dir=runs/my run", "optim.weight_decay=1e-4", "model.hidden=[64]"});
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 0.01);  // the override wins over the file
  EXPECT_FALSE(c.get_bool("data.shuffle"));
  EXPECT_EQ(c.get_ints("model.hidden"), std::vector<int64_t>{64});  // the last one wins
  EXPECT_EQ(c.get_int("train.steps"), 7);
  EXPECT_EQ(c.get_string("train.run_dir"), "runs/my run");
  EXPECT_DOUBLE_EQ(c.get_float("optim.weight_decay"), 1e-4);
  Config d = parse_config("", "t.yaml", {"optim.lr=1", "model.hidden=512"});
  EXPECT_DOUBLE_EQ(d.get_float("optim.lr"), 1.0);  // an int is a valid float
  EXPECT_EQ(d.get_ints("model.hidden"), std::vector<int64_t>{512});  // one int is a list of one
}

TEST(LauncherConfig, OverrideByLastPartWhenUnique) {
  Config c = parse_config("", "t.yaml", {"device=CUDA", "lr=0.5", "precision=bf16"});
  EXPECT_EQ(c.get_string("train.device"), "CUDA");
  EXPECT_DOUBLE_EQ(c.get_float("optim.lr"), 0.5);
  EXPECT_EQ(c.get_string("train.precision"), "bf16");
  // "seed" ends data.seed and train.seed: not guessed
  EXPECT_NE(error_of([] { parse_config("", "t.yaml", {"seed=3"}); }).find("unknown config key 'seed'"),
            std::string::npos);
}

TEST(LauncherConfig, UnknownKeySuggestsNearest) {
  EXPECT_EQ(error_of([] { parse_config("optim:\n  lrr: 0.1\n", "cfg.yaml"); }),
            "cfg.yaml: unknown config key 'optim.lrr' (did you mean 'optim.lr'?)");
  EXPECT_EQ(error_of([] { parse_config("", "cfg.yaml", {"trian.epochs=3"}); }),
            "override: unknown config key 'trian.epochs' (did you mean 'train.epochs'?)");
  EXPECT_EQ(error_of([] { parse_config("", "cfg.yaml", {"data.batchsize=3"}); }),
            "override: unknown config key 'data.batchsize' (did you mean 'data.batch_size'?)");
  // A key in the wrong section finds its section.
  EXPECT_EQ(nearest_key("data.lr"), "optim.lr");
  // Nothing close: no suggestion.
  EXPECT_EQ(error_of([] { parse_config("", "c", {"zzzzzzzz.qqqqqqqq=1"}); }),
            "override: unknown config key 'zzzzzzzz.qqqqqqqq'");
  // A top-level scalar is not a section.
  EXPECT_NE(error_of([] { parse_config("lr: 0.1\n", "c.yaml"); }).find("'lr' is not a section"), std::string::npos);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("mpl", "mlp"), 1u);  // a transposition is one edit
  EXPECT_EQ(edit_distance("mpl", "gpt"), 2u);
}

TEST(LauncherConfig, BadValuesAreOneLineErrors) {
  auto err = [](std::vector<std::string> o) { return error_of([&] { parse_config("", "c.yaml", o); }); };
  EXPECT_EQ(err({"optim.lr=-0.1"}), "config: optim.lr must be >= 0, got -0.1");
  EXPECT_EQ(err({"data.batch_size=0"}), "config: data.batch_size must be > 0, got 0");
  EXPECT_EQ(err({"data.batch_size=1.5"}), "override: data.batch_size must be an int, got '1.5'");
  EXPECT_EQ(err({"optim.lr=fast"}), "override: optim.lr must be a float, got 'fast'");
  EXPECT_EQ(err({"data.shuffle=maybe"}), "override: data.shuffle must be a bool, got 'maybe'");
  EXPECT_EQ(err({"model.hidden=[256, x]"}), "override: model.hidden must be a list of ints, got a list");
  EXPECT_EQ(err({"model.hidden=[0]"}), "config: model.hidden widths must be > 0, got 0");
  EXPECT_EQ(err({"optim.name=adamm"}), "config: optim.name='adamm' is not one of sgd, adam, adamw, lamb (did you mean 'adam'?)");
  EXPECT_EQ(err({"model.name=mpl"}).rfind("config: model.name='mpl' is not one of ", 0), 0u);
  EXPECT_NE(err({"model.name=mpl"}).find("(did you mean 'mlp'?)"), std::string::npos);
  EXPECT_EQ(err({"optim.momentum=1.5"}), "config: optim.momentum must be in [0, 1), got 1.5");
  EXPECT_EQ(err({"optim.nesterov=true"}), "config: optim.nesterov=true needs optim.momentum > 0");
  EXPECT_EQ(err({"train.epochs=0"}), "config: train.epochs or train.steps must be > 0");
  EXPECT_EQ(err({"train.resume=true"}), "config: train.resume=true needs train.run_dir (the run to continue)");
  EXPECT_EQ(err({"train.precision=fp16"}), "config: train.precision='fp16' is not one of fp32, bf16 (did you mean 'fp32'?)");
  EXPECT_EQ(err({"distributed.backend=shm"}).rfind("config: distributed.backend='shm' is not one of auto, mpi, nccl, gloo", 0), 0u);
  EXPECT_EQ(err({"distributed.grad_dtype=fp16"}).rfind("config: distributed.grad_dtype='fp16' is not one of fp32, bf16", 0), 0u);
  EXPECT_EQ(err({"train.keep_checkpoints=-1"}), "config: train.keep_checkpoints must be >= 0, got -1");
  EXPECT_EQ(err({"train.keep_checkpoints=2.5"}), "override: train.keep_checkpoints must be an int, got '2.5'");
  EXPECT_EQ(err({"lr"}), "override 'lr' is not of the form key=value (e.g. optim.lr=0.01)");
  EXPECT_EQ(error_of([] { parse_config("data:\n  batch_size: [1, 2]\n", "c.yaml"); }),
            "c.yaml: data.batch_size must be an int, got a list");
  EXPECT_EQ(error_of([] { parse_config("model: [1, 2\n", "c.yaml"); }).rfind("c.yaml: invalid YAML at line", 0), 0u);
  EXPECT_EQ(error_of([] { load_config("/nonexistent/x.yaml"); }), "cannot read config file '/nonexistent/x.yaml'");
  for (const auto& o : std::vector<std::string>{"optim.lr=-1", "trian.x=1", "optim.name=adamm"})
    EXPECT_EQ(err({o}).find('\n'), std::string::npos) << o;
}

TEST(LauncherConfig, ResolvedYamlRoundTrips) {
  Config c = parse_config("", "c.yaml", {"optim.lr=3e-4", "model.hidden=[10, 20]", "train.run_dir=a b", "optim.b2=0.98",
                                         "data.shuffle=false", "optim.weight_decay=0"});
  Config back = parse_config(c.to_yaml(), "resolved.yaml");
  EXPECT_EQ(back.values(), c.values());
}

TEST(LauncherConfig, LoadsTheShippedConfigs) {
  for (const char* name : {"fmnist_mlp", "fmnist_cnn", "fmnist_mlp_bf16"}) {
    Config c = load_config(std::string(TG_SOURCE_DIR) + "/configs/" + name + ".yaml");
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.get_string("optim.name"), "adam");
    EXPECT_EQ(c.get_int("data.batch_size"), 128);
  }
}

// The language-model configs resolve: GPT-2 small's sizes, the char model on the text dataset,
// and a global batch that splits into the micro-batches it names.
TEST(LauncherConfig, LoadsTheLanguageModelConfigs) {
  Config g = load_config(std::string(TG_SOURCE_DIR) + "/configs/gpt2_124m.yaml");
  EXPECT_EQ(g.get_string("model.name"), "gpt");
  EXPECT_EQ(g.get_int("model.n_embd"), 768);
  EXPECT_EQ(g.get_int("model.vocab_size"), 50304);
  EXPECT_EQ(g.get_string("data.name"), "tokens");
  EXPECT_EQ(g.get_int("data.batch_size") % g.get_int("train.grad_accum"), 0);
  EXPECT_EQ(g.get_string("train.precision"), "bf16");
  Config c = load_config(std::string(TG_SOURCE_DIR) + "/configs/gpt_char.yaml");
  EXPECT_EQ(c.get_string("data.name"), "text");
  EXPECT_EQ(c.get_int("model.vocab_size"), 0);  // the dataset's (256)
  EXPECT_EQ(c.get_string("optim.name"), "adamw");
}

TEST(LauncherRunDir, ExistingRunDirIsNotOverwritten) {
  fs::path dir = temp_dir("rundir");
  fs::create_directories(dir);
  std::ofstream(dir / "keep.txt") << "precious";
  Config c = parse_config("", "c.yaml", {"train.run_dir=" + dir.string()});
  std::string msg = error_of([&] { prepare_run_dir(c); });
  EXPECT_EQ(msg, "run directory '" + dir.string() +
                     "' already exists (use train.overwrite=true to replace it or train.resume=true to continue it)");
  EXPECT_NE(error_of([&] { run_train(c, {.progress = false}); }).find("already exists"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir / "keep.txt"));
  // overwrite=true empties it; resume=true keeps it.
  Config r = parse_config("", "c.yaml", {"train.run_dir=" + dir.string(), "train.resume=true"});
  EXPECT_EQ(prepare_run_dir(r), dir.string());
  EXPECT_TRUE(fs::exists(dir / "keep.txt"));
  EXPECT_NE(error_of([&] { run_train(r, {.progress = false}); }).find("no complete checkpoint"), std::string::npos);
  Config o = parse_config("", "c.yaml", {"train.run_dir=" + dir.string(), "train.overwrite=true"});
  EXPECT_EQ(prepare_run_dir(o), dir.string());
  EXPECT_FALSE(fs::exists(dir / "keep.txt"));
  EXPECT_TRUE(fs::is_directory(dir));
  // An empty existing directory is fine.
  EXPECT_EQ(prepare_run_dir(c), dir.string());
  fs::remove_all(dir);
}

// Note [restarts resume]: a group restarted by tg launch continues its run directory, or starts
// it afresh while no checkpoint is complete; the first attempt, and runs without train.run_dir,
// are left as they are. (tests/scripts/launch_train.sh resumes from a real checkpoint.)
TEST(LauncherRunDir, ARestartedGroupContinuesItsRunDirectory) {
  fs::path dir = temp_dir("restarted");
  fs::create_directories(dir / "checkpoints");
  Config c = parse_config("", "c.yaml", {"train.run_dir=" + dir.string()});
  EXPECT_FALSE(restarted_config(c).get_bool("train.overwrite"));  // TG_RESTART_COUNT unset
  ::setenv("TG_RESTART_COUNT", "0", 1);
  EXPECT_FALSE(restarted_config(c).get_bool("train.overwrite"));  // the first attempt
  ::setenv("TG_RESTART_COUNT", "1", 1);
  Config again = restarted_config(c);
  EXPECT_TRUE(again.get_bool("train.overwrite"));  // nothing complete to resume from yet
  EXPECT_FALSE(again.get_bool("train.resume"));
  Config unnamed = restarted_config(parse_config("", "c.yaml"));
  EXPECT_FALSE(unnamed.get_bool("train.overwrite"));
  EXPECT_FALSE(unnamed.get_bool("train.resume"));
  ::unsetenv("TG_RESTART_COUNT");
  fs::remove_all(dir);
}

TEST(LauncherRunDir, DefaultNameIsFreshPerRun) {
  Config c;
  c.name = "unit";
  std::string a = choose_run_dir(c);
  EXPECT_EQ(a.rfind("runs/unit-", 0), 0u);
  fs::create_directories(a);
  std::ofstream(fs::path(a) / "x") << 1;
  std::string b = choose_run_dir(c);  // same second: a suffix, never the same directory
  EXPECT_NE(a, b);
  fs::remove_all(a);
  std::error_code ec;
  fs::remove("runs", ec);  // only when empty
}

TEST(LauncherRegistry, BuiltinsAndUserRegistrations) {
  auto models = model_registry().names(), datasets = dataset_registry().names();
  for (const char* m : {"mlp", "cnn", "test_tiny"})
    EXPECT_NE(std::find(models.begin(), models.end(), m), models.end()) << m;
  EXPECT_NE(std::find(datasets.begin(), datasets.end(), "fashion_mnist"), datasets.end());
  EXPECT_NE(std::find(datasets.begin(), datasets.end(), "test_empty"), datasets.end());

  Config c = parse_config("", "c.yaml", {"model.hidden=[256]"});
  auto mlp = make_model(c);
  EXPECT_EQ(mlp->num_parameters(), 784 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ((*mlp)(Tensor::zeros({2, 1, 28, 28})).shape(), (Shape{2, 10}));
  auto cnn = make_model(parse_config("", "c.yaml", {"model.name=cnn"}));
  // conv 1->32 5x5, 32->32 5x5, bn 32, conv 32->64 3x3, 64->64 3x3, bn 64, linear 576->10
  EXPECT_EQ(cnn->num_parameters(), 832 + 25632 + 64 + 18496 + 36928 + 128 + 5770);
  EXPECT_EQ((*cnn)(Tensor::zeros({2, 1, 28, 28})).shape(), (Shape{2, 10}));
  auto tiny = make_model(parse_config("", "c.yaml", {"model.name=test_tiny"}));  // the user's model validates
  EXPECT_EQ(tiny->num_parameters(), 4 * 3 + 3);

  EXPECT_EQ(error_of([] { model_registry().add("mlp", [](const Config&) { return make_mlp({8}); }); }),
            "register model 'mlp': the name is already registered");
  EXPECT_EQ(error_of([] { model_registry().get("nope"); }).rfind("unknown model 'nope' (registered: ", 0), 0u);
  EXPECT_EQ(error_of([] { Trainer t(parse_config("", "c.yaml", {"data.name=test_empty"}), "/nonexistent"); }),
            "dataset 'test_empty' has an empty split (train 0, test 0 examples)");
}

TEST(LauncherCli, ErrorsAreOneLineAndExitOne) {
  auto run = [](std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    testing::internal::CaptureStderr();
    testing::internal::CaptureStdout();
    int rc = tg_main(static_cast<int>(argv.size()), argv.data());
    testing::internal::GetCapturedStdout();
    return std::make_pair(rc, testing::internal::GetCapturedStderr());
  };
  std::string cfg = std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml";
  auto [rc, err] = run({"tg", "train", cfg, "optim.lrr=0.1"});
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(err, "error: override: unknown config key 'optim.lrr' (did you mean 'optim.lr'?)\n");
  EXPECT_EQ(run({"tg", "frobnicate"}).second,
            "error: unknown command 'frobnicate' (commands: train, config, keys, info, bench, tokenize, sample, plot, trace, launch, help)\n");
  EXPECT_EQ(run({"tg", "bench", "matmul_999"}).second,
            "error: tg bench: unknown workload 'matmul_999' (workloads: cnn_step, cnn_step_bf16, colsum_16384, conv2d, copy, "
            "copy_8192, copy_peer, elementwise, elementwise_8192, gpt2_step, gpt2_step_t4096, gpt_char_step, layernorm, "
            "layernorm_8192, layernorm_bwd_16384, matmul_1024, "
            "matmul_1024_bf16, matmul_2048, matmul_2048_bf16, matmul_8192_bf16, matmul_8192_fp16, mlp_step, mlp_step_b16, "
            "mlp_step_bf16, softmax, softmax_8192)\n");
  EXPECT_EQ(run({"tg", "bench", "copy_peer"}).second, "error: tg bench copy_peer: needs two CPU devices, found 1\n");
  EXPECT_EQ(run({"tg", "train"}).first, 1);
  EXPECT_EQ(run({"tg", "train", cfg, "stray"}).second,
            "error: unexpected argument 'stray' (overrides are key=value, e.g. optim.lr=0.01)\n");
  auto [rc2, err2] = run({"tg", "train", cfg, "data.root=/nonexistent", "train.run_dir=/nonexistent/run"});
  EXPECT_EQ(rc2, 1);
  EXPECT_NE(err2.find("dataset-fashion-mnist"), std::string::npos) << err2;
  EXPECT_FALSE(fs::exists("/nonexistent/run"));
  EXPECT_EQ(run({"tg", "config", cfg, "optim.lr=0.5"}).first, 0);
  EXPECT_EQ(run({"tg", "info"}).first, 0);
}

TEST(LauncherInfo, NamesFeaturesDevicesAndKnobs) {
  std::string info = info_text();
  for (const char* want : {"CPU kernels:", "devices:", "memory pool:", "knobs", "DEBUG=", "models:", "nlohmann-json", "process-group backends: local", "NCCL: ", "rendezvous store: ",
                           "copies between the devices of a process", "  CPU -> CPU:1: through host\n"})
    EXPECT_NE(info.find(want), std::string::npos) << want << "\n" << info;
}

// A directory used to open as an empty config (`tg train /tmp` trained the defaults); a FIFO
// blocked in open() until a writer came. Both are refused before they are opened.
TEST(LauncherConfigFile, DirectoryAndFifoAreRefusedByName) {
  fs::path dir = temp_dir("config_dir");
  fs::create_directories(dir);
  EXPECT_EQ(error_of([&] { load_config(dir.string()); }),
            "config file '" + dir.string() + "' is a directory (give a YAML file, e.g. configs/fmnist_mlp.yaml)");
  auto [rc, out, err] = tg_run({"tg", "train", dir.string(), "train.run_dir=" + (dir / "run").string()});
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(err, "error: config file '" + dir.string() + "' is a directory (give a YAML file, e.g. configs/fmnist_mlp.yaml)\n");
  EXPECT_FALSE(fs::exists(dir / "run"));

  fs::path fifo = dir / "config.yaml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto result = std::async(std::launch::async, [&] { return error_of([&] { load_config(fifo.string()); }); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // lets the blocked reader go
    ADD_FAILURE() << "load_config blocked on a FIFO";
    if (fd >= 0) ::close(fd);
  }
  EXPECT_EQ(result.get(), "config file '" + fifo.string() + "' is a FIFO (a config must be a regular YAML file)");
  // A symbolic link to a regular file is followed.
  fs::create_symlink(std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", dir / "link.yaml");
  EXPECT_EQ(load_config((dir / "link.yaml").string()).get_string("model.name"), "mlp");
  fs::remove_all(dir);
}

// yaml-cpp keeps every pair of a map whose key repeats (Note [duplicate keys] in config.cpp); the
// last one used to win silently.
TEST(LauncherConfig, DuplicateKeysNameTheKeyAndLines) {
  EXPECT_EQ(error_of([] { parse_config("optim:\n  lr: 0.1\n  b1: 0.5\n  lr: 0.2\n", "c.yaml"); }),
            "c.yaml: duplicate key 'optim.lr' at line 4 (first at line 2)");
  EXPECT_EQ(error_of([] { parse_config("model: {name: mlp, name: cnn}\n", "c.yaml"); }),
            "c.yaml: duplicate key 'model.name' at line 1 (first at line 1)");
  EXPECT_EQ(error_of([] { parse_config("optim:\n  lr: 0.1\ndata:\n  seed: 1\noptim:\n  b1: 0.5\n", "c.yaml"); }),
            "c.yaml: duplicate section 'optim' at line 5 (first at line 1)");
  // The same leaf in two sections is no duplicate; an override still replaces a file's value.
  Config c = parse_config("data:\n  seed: 1\ntrain:\n  seed: 2\n", "c.yaml", {"data.seed=3"});
  EXPECT_EQ(c.get_int("data.seed"), 3);
  EXPECT_EQ(c.get_int("train.seed"), 2);
}

// yaml-cpp writes bytes that are not UTF-8 as U+FFFD, so such a string came back changed from the
// resolved config.yaml (found by tests/fuzz/fuzz_config); it is refused by key (Note [config
// strings are UTF-8] in config.cpp), and UTF-8 text round-trips.
TEST(LauncherConfig, StringsMustBeUtf8AndRoundTrip) {
  EXPECT_EQ(error_of([] { parse_config("", "c.yaml", {"data.root=/data/caf\xe9"}); }),
            "override: data.root must be UTF-8 text, got an invalid byte at offset 9");
  EXPECT_EQ(error_of([] { parse_config("train:\n  run_dir: \"runs/\xc0\xaf\"\n", "c.yaml"); }),  // overlong '/'
            "c.yaml: train.run_dir must be UTF-8 text, got an invalid byte at offset 5");
  EXPECT_EQ(error_of([] { parse_config("", "c.yaml", {"train.device=CUDA\xed\xa0\x80"}); }),  // a surrogate
            "override: train.device must be UTF-8 text, got an invalid byte at offset 4");
  Config c = parse_config("", "c.yaml", {"data.root=/data/café ☕ 𝄞", "train.run_dir=tab\there"});
  EXPECT_EQ(parse_config(c.to_yaml(), "resolved.yaml").values(), c.values());
}

// `error: stoi` for --reps=abc; `error: std::bad_alloc` for a huge model.hidden; tg_main printed
// only the first line of a message (load_state_dict's missing and unexpected keys were dropped).
TEST(LauncherCli, ErrorsNameTheArgumentAndKeepEveryLine) {
  for (const char* reps : {"abc", "0", "-3", "1.5", "99999999999"}) {
    EXPECT_EQ(tg_run({"tg", "bench", std::string("--reps=") + reps, "copy"}).err,
              std::string("error: tg bench: --reps must be a whole number from 1 to 1000000, got '") + reps + "'\n");
    EXPECT_EQ(tg_run({"tg", "bench", "--reps", reps, "copy"}).err,
              std::string("error: tg bench: --reps must be a whole number from 1 to 1000000, got '") + reps + "'\n");
  }
  EXPECT_EQ(tg_run({"tg", "bench", "--reps=", "copy"}).err,
            "error: tg bench: --reps= has no value (usage: tg bench [--reps=N] [WORKLOAD ...]; tg help bench)\n");

  std::string huge = error_of([] { make_model(parse_config("", "c.yaml", {"model.hidden=[1000000000]"})); });
  EXPECT_EQ(huge.rfind("model.hidden=[1000000000] makes an MLP of 795000000010 parameters, 2.9 TiB as float32, more than "
                       "this machine's ", 0), 0u) << huge;
  std::string overflow = error_of([] {
    make_model(parse_config("", "c.yaml", {"model.hidden=[9223372036854775807, 9223372036854775807]"}));
  });
  EXPECT_NE(overflow.find("makes an MLP of 8.51e+37 parameters"), std::string::npos) << overflow;
  auto [rc, out, err] = tg_run({"tg", "train", std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", "data.name=test_synth",
                           "data.batch_size=8", "model.hidden=[1000000000]", "train.run_dir=" + temp_dir("huge").string()});
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(err.rfind("error: model.hidden=[1000000000] makes an MLP of ", 0), 0u) << err;
  EXPECT_FALSE(fs::exists(temp_dir("huge")));

  // A device index past int: named (not `stoi`), whether or not this build has OpenCL.
  auto [rc_cl, out_cl, err_cl] = tg_run({"tg", "train", std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", "data.name=test_synth",
                                 "data.batch_size=8", "train.device=CL:99999999999", "train.run_dir=" + temp_dir("cl").string()});
  EXPECT_EQ(rc_cl, 1);
  EXPECT_NE(err_cl.find("device 'CL:99999999999'"), std::string::npos) << err_cl;

  fs::path dir = temp_dir("whole_message"), weights = temp_dir("whole_message_weights");
  fs::create_directories(weights);
  nn::safe_save({{"bogus", Tensor::ones({2})}}, (weights / "w.safetensors").string());
  auto [rc2, out2, err2] = tg_run({"tg", "train", std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml", "data.name=test_synth",
                             "data.batch_size=8", "model.name=test_mlp", "train.run_dir=" + dir.string(),
                             "train.init_weights=" + (weights / "w.safetensors").string()});
  EXPECT_EQ(rc2, 1);
  EXPECT_EQ(err2.rfind("error: load_state_dict: cannot load into Sequential:\n  missing keys: '1.weight', ", 0), 0u) << err2;
  EXPECT_NE(err2.find("\n  unexpected keys: 'bogus'\n"), std::string::npos) << err2;
  fs::remove_all(dir);
  fs::remove_all(weights);
}

TG_REGISTER_MODEL("test_out_of_memory", [](const Config&) -> std::unique_ptr<nn::Module> { throw std::bad_alloc(); });

TEST(LauncherRegistry, OutOfMemoryWhileBuildingNamesTheModel) {
  EXPECT_EQ(error_of([] { make_model(parse_config("", "c.yaml", {"model.name=test_out_of_memory"})); }),
            "model 'test_out_of_memory' (model.hidden=[256]) does not fit in memory: building it failed");
}

// Note [ranks agree before they train] in rank_agreement.cpp: the canonical texts of two ranks'
// configs and models, and the differences named between them.
TEST(LauncherRankAgreement, TextsNameTheFirstDifferences) {
  auto world = dist::make_local_world(2);
  auto group = dist::local_group(world, 0);
  Config a = parse_config("", "c.yaml"), b = parse_config("", "c.yaml", {"model.hidden=[128]", "optim.lr=0.0010000001"});
  std::string ta = config_agreement_text(a, *group), tb = config_agreement_text(b, *group);
  EXPECT_NE(ta.find("model.hidden = [256]\n"), std::string::npos) << ta;
  EXPECT_NE(ta.find("world size = 2\n"), std::string::npos) << ta;
  EXPECT_EQ(text_differences(ta, tb, 1), (std::vector<std::string>{"model.hidden: [128] on rank 1, [256] on rank 0",
                                                                     "optim.lr: 0.0010000001 on rank 1, 0.001 on rank 0"}));
  // The keys only rank 0 uses, and each rank's own device, are left out (Note [keys that may differ per rank]).
  Config c = parse_config("", "c.yaml", {"train.run_dir=/elsewhere", "train.overwrite=true", "train.device=CPU"});
  EXPECT_EQ(config_agreement_text(c, *group), ta);
  EXPECT_EQ(digest64(ta), digest64(config_agreement_text(a, *group)));
  EXPECT_NE(digest64(ta), digest64(tb));

  std::string wide = model_agreement_text(*make_mlp({256})), narrow = model_agreement_text(*make_mlp({128}));
  EXPECT_EQ(wide, "parameter 1.bias = float32[256]\nparameter 1.weight = float32[256,784]\n"
                  "parameter 3.bias = float32[10]\nparameter 3.weight = float32[10,256]\n");
  EXPECT_EQ(text_differences(wide, narrow, 1)[1], "parameter 1.weight: float32[128,784] on rank 1, float32[256,784] on rank 0");
  auto vs_cnn = text_differences(wide, model_agreement_text(*make_mnist_cnn()), 1, 2);
  EXPECT_EQ(vs_cnn, (std::vector<std::string>{"parameter 1.bias: missing on rank 1, float32[256] on rank 0",
                                              "parameter 1.weight: missing on rank 1, float32[256,784] on rank 0",
                                              "(and 22 more differences)"}));
}

TEST(LauncherRankAgreement, EveryRankThrowsNamingTheRanksAndKeys) {
  // texts[r] is rank r's; the messages each rank got ("" when it passed).
  auto check = [](std::vector<std::string> texts) {
    std::vector<std::string> messages(texts.size());
    dist::run_local(static_cast<int>(texts.size()), [&](dist::ProcessGroup& g) {
      try {
        check_ranks_agree(g, "config", texts[static_cast<size_t>(g.rank())]);
      } catch (const Error& e) {
        messages[static_cast<size_t>(g.rank())] = e.what();
      }
    });
    return messages;
  };
  EXPECT_EQ(check({"a = 1\nb = 2\n", "a = 1\nb = 2\n", "a = 1\nb = 2\n"}), (std::vector<std::string>(3, "")));
  auto m = check({"a = 1\nb = 2\n", "a = 1\nb = 2\n", "a = 1\nb = 3\n"});
  for (int r = 0; r < 3; r++)
    EXPECT_EQ(m[static_cast<size_t>(r)],
              "the ranks disagree on the config before training: rank 2 differs from rank 0 (this is rank " + std::to_string(r) +
                  " of 3)\n  b: 3 on rank 2, 2 on rank 0\nevery rank must train the same config and model (only "
                  "train.run_dir, train.overwrite, train.device may differ)");
  // Two ranks differ: every rank names the lower one's differences; the other adds its own.
  m = check({"a = 1\nb = 2\n", "a = 5\nb = 2\n", "a = 1\nb = 2\nc = 4\n"});
  for (const auto& msg : m) EXPECT_NE(msg.find("ranks 1, 2 differ from rank 0"), std::string::npos) << msg;
  for (const auto& msg : m) EXPECT_NE(msg.find("\n  a: 5 on rank 1, 1 on rank 0\n"), std::string::npos) << msg;
  EXPECT_NE(m[2].find("\n  and on this rank:\n  c: 4 on rank 2, missing on rank 0\n"), std::string::npos) << m[2];
  EXPECT_EQ(m[1].find("and on this rank"), std::string::npos) << m[1];
}

// Every command has help (`tg help X`, `tg X --help`); `tg --version` names version, commit and
// build features; an argument a command does not take is an error, never ignored.
TEST(LauncherCli, HelpForEveryCommandVersionAndNoIgnoredArguments) {
  for (const char* cmd : {"train", "config", "keys", "info", "bench", "tokenize", "sample", "plot", "trace"}) {
    CliRun help = tg_run({"tg", "help", cmd}), flag = tg_run({"tg", cmd, "--help"});
    EXPECT_EQ(help.rc, 0) << cmd << help.err;
    EXPECT_NE(help.out.find(std::string("Usage: tg ") + cmd), std::string::npos) << help.out;
    EXPECT_EQ(flag.rc, 0) << cmd;
    EXPECT_EQ(flag.out, help.out) << cmd;
  }
  CliRun train = tg_run({"tg", "help", "train"});
  for (const char* want : {"CONFIG", "OVERRIDES", "key=value", "tg keys"}) EXPECT_NE(train.out.find(want), std::string::npos) << want;
  CliRun sample = tg_run({"tg", "sample", "--help"});
  for (const char* want : {"--prompt", "--tokens", "--temperature", "--top-k", "--seed"})
    EXPECT_NE(sample.out.find(want), std::string::npos) << want;
  EXPECT_EQ(tg_run({"tg", "help", "nope"}).err,
            "error: tg help: unknown command 'nope' (commands: train, config, keys, info, bench, tokenize, sample, plot, trace, launch, help)\n");
  CliRun general = tg_run({"tg", "help"});
  EXPECT_EQ(general.rc, 0);
  for (const char* cmd : {"tg train ", "tg config ", "tg keys", "tg info", "tg bench ", "tg tokenize ", "tg sample ", "tg plot ", "tg trace merge ", "tg help "})
    EXPECT_NE(general.out.find(cmd), std::string::npos) << cmd;
  EXPECT_EQ(tg_run({"tg"}).rc, 1);

  CliRun version = tg_run({"tg", "--version"});
  EXPECT_EQ(version.rc, 0);
  EXPECT_EQ(version.out, version_text());

  const std::string cfg = std::string(TG_SOURCE_DIR) + "/configs/fmnist_mlp.yaml";
  std::vector<std::vector<std::string>> stray = {{"tg", "keys", "extra"},
                                                 {"tg", "info", "--verbose"},
                                                 {"tg", "bench", "--repz=3", "copy"},
                                                 {"tg", "config", cfg, "--lr=0.1"},
                                                 {"tg", "tokenize", "a.txt", "b.bin", "c.bin"},
                                                 {"tg", "sample", "dir", "--prompt", "x", "--topk=3"}};
  for (const auto& args : stray) {
    CliRun r = tg_run(args);
    EXPECT_EQ(r.rc, 1) << args[1];
    EXPECT_EQ(r.err.rfind("error: tg " + args[1] + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("tg help " + args[1]), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_NE(tg_run({"tg", "keys", "extra"}).err.find("extra"), std::string::npos);
  // key=value overrides after the config work as before, in either order with nothing between
  CliRun resolved = tg_run({"tg", "config", cfg, "lr=0.25", "train.steps=7"});
  EXPECT_EQ(resolved.rc, 0) << resolved.err;
  EXPECT_NE(resolved.out.find("lr: 0.25"), std::string::npos) << resolved.out;
  EXPECT_NE(resolved.out.find("steps: 7"), std::string::npos) << resolved.out;
}

// A model registers its own config key (test_wide, tests/launcher_models.h): `tg keys` lists it
// with type, default and help, overrides are typed and checked, a typo suggests it, and the
// factory reads it.
TEST(LauncherRegistry, ModelKeysAreListedTypedAndChecked) {
  CliRun keys = tg_run({"tg", "keys"});
  EXPECT_EQ(keys.rc, 0);
  const size_t at = keys.out.find("  model.test_width (int, 8)");
  ASSERT_NE(at, std::string::npos) << keys.out;
  EXPECT_NE(keys.out.find("test_wide: the hidden layer's width", at), std::string::npos);
  EXPECT_LT(at, keys.out.find("  data.name")) << "listed in its section";
  EXPECT_EQ(error_of([] { parse_config("", "c.yaml", {"model.name=test_wide", "model.test_width=1"}); }),
            "config: model.test_width must be >= 2, got 1");
  EXPECT_NE(error_of([] { parse_config("", "c.yaml", {"model.test_width=wide"}); }).find("model.test_width"), std::string::npos);
  EXPECT_EQ(error_of([] { parse_config("", "c.yaml", {"model.test_widht=4"}); }),
            "override: unknown config key 'model.test_widht' (did you mean 'model.test_width'?)");
  Config c = parse_config("model:\n  name: test_wide\n  test_width: 5\n", "c.yaml");
  EXPECT_EQ(make_model(c)->num_parameters(), 4 * 5 + 5 + 5 * 3 + 3);
  EXPECT_NE(c.to_yaml().find("test_width: 5"), std::string::npos);
}
