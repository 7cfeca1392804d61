// `tg plot`: two short real runs (a tiny MLP on synthetic images, metrics.jsonl written by the
// trainer) drawn as a PNG and an SVG, read back: the PNG holds each run's colour on hundreds of
// pixels (its curve), the SVG a stroke per run in its colour through every logged step; and bad
// input (a missing run directory, no metrics.jsonl, no records, an unknown metric, a bad file
// type) is a one-line error naming it. The drawing tests skip where the build has no cairo.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "launcher/plot.h"
#include "launcher/registry.h"
#include "launcher/run.h"
#include "tests/run_util.h"
#include "tests/synth_images.h"

#ifdef TG_HAVE_CAIRO
#include <cairo.h>
#endif

namespace fs = std::filesystem;
using namespace tg;
using namespace tg::launcher;

namespace {

using testutil::synth_images;
TG_REGISTER_MODEL("plot_mlp", [](const Config&) { return make_mlp({16}, 4, 3); });
TG_REGISTER_DATASET("plot_synth", [](const Config&) { return image_splits(synth_images(48, 0), synth_images(24, 1), 0.3, 0.3, 3); });

const int STEPS = 30;

// A run of STEPS steps with a loss record every step and an evaluation every 10.
fs::path train_run(const fs::path& root, const std::string& name, double lr) {
  fs::path dir = root / name;
  std::vector<std::string> o = {"model.name=plot_mlp", "data.name=plot_synth", "data.batch_size=8",
                                "train.steps=" + std::to_string(STEPS), "train.log_every=1", "train.eval_every=10",
                                "optim.lr=" + std::to_string(lr), "train.run_dir=" + dir.string()};
  run_train(parse_config("", "plot.yaml", o), {.progress = false});
  return dir;
}

// Two runs, trained once for every test of the binary.
struct Runs {
  fs::path root, fast, slow;
};
const Runs& two_runs() {
  static const Runs runs = [] {
    fs::path root = testutil::fresh_run_dir("plot", "runs");
    return Runs{root, train_run(root, "fast", 0.05), train_run(root, "slow", 0.005)};
  }();
  return runs;
}

using testutil::CliRun;
using testutil::tg_run;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

#ifdef TG_HAVE_CAIRO
// Pixels of exactly this colour (opaque) in a PNG.
struct Picture {
  int width = 0, height = 0;
  std::vector<uint32_t> argb;
  size_t count(std::array<uint8_t, 3> c) const {
    const uint32_t want = 0xff000000u | uint32_t(c[0]) << 16 | uint32_t(c[1]) << 8 | c[2];
    return static_cast<size_t>(std::count(argb.begin(), argb.end(), want));
  }
};
Picture read_png(const fs::path& p) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(p.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << p;
  Picture pic;
  if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
    cairo_surface_flush(s);
    pic.width = cairo_image_surface_get_width(s);
    pic.height = cairo_image_surface_get_height(s);
    const int stride = cairo_image_surface_get_stride(s);
    const unsigned char* data = cairo_image_surface_get_data(s);
    for (int y = 0; y < pic.height; y++) {
      const auto* row = reinterpret_cast<const uint32_t*>(data + static_cast<ptrdiff_t>(y) * stride);
      pic.argb.insert(pic.argb.end(), row, row + pic.width);
    }
  }
  cairo_surface_destroy(s);
  return pic;
}
#endif

// The strokes of an SVG: each <path>'s stroke colour (0..255 per channel) and its number of
// line-to commands. Cairo writes the colour as rgb(R%,G%,B%); rgb(R,G,B) and #rrggbb are read too.
struct Stroke {
  std::array<double, 3> rgb;
  size_t line_tos;
  double x_min, x_max;
};

// The smallest and largest x of a path of M and L commands ("M 80 20 L 106 20").
std::pair<double, double> x_extent(const std::string& path_data) {
  std::istringstream in(path_data);
  double lo = 1e300, hi = -1e300, x, y;
  for (std::string command; in >> command;)
    if ((command == "M" || command == "L") && in >> x >> y) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  return {lo, hi};
}
std::vector<Stroke> svg_strokes(const std::string& svg) {
  std::vector<Stroke> out;
  static const std::regex path(R"(<path\b[^>]*>)");
  static const std::regex pct(R"(stroke:\s*rgb\(\s*([0-9.]+)%\s*,\s*([0-9.]+)%\s*,\s*([0-9.]+)%\s*\))");
  static const std::regex ints(R"(stroke:\s*rgb\(\s*([0-9]+)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*\))");
  static const std::regex hex(R"(stroke:\s*#([0-9a-fA-F]{2})([0-9a-fA-F]{2})([0-9a-fA-F]{2}))");
  static const std::regex d(R"(\sd=\"([^\"]*)\")");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), path); it != std::sregex_iterator(); ++it) {
    const std::string tag = it->str();
    std::smatch m, dm;
    std::array<double, 3> rgb;
    if (std::regex_search(tag, m, pct)) {
      for (int i = 0; i < 3; i++) rgb[i] = std::stod(m[i + 1].str()) * 2.55;
    } else if (std::regex_search(tag, m, ints)) {
      for (int i = 0; i < 3; i++) rgb[i] = std::stod(m[i + 1].str());
    } else if (std::regex_search(tag, m, hex)) {
      for (int i = 0; i < 3; i++) rgb[i] = std::stoi(m[i + 1].str(), nullptr, 16);
    } else {
      continue;  // no stroke: glyphs, fills
    }
    std::string path_data = std::regex_search(tag, dm, d) ? dm[1].str() : "";
    auto [lo, hi] = x_extent(path_data);
    out.push_back({rgb, static_cast<size_t>(std::count(path_data.begin(), path_data.end(), 'L')), lo, hi});
  }
  return out;
}

// The stroke in colour c with the most line-tos (none: 0 line-tos).
Stroke longest_stroke(const std::vector<Stroke>& strokes, std::array<uint8_t, 3> c) {
  Stroke best{{}, 0, 0, 0};
  for (const auto& s : strokes) {
    bool same = true;
    for (int i = 0; i < 3; i++) same = same && std::abs(s.rgb[i] - c[i]) < 1.0;
    if (same && s.line_tos >= best.line_tos) best = s;
  }
  return best;
}

void require_cairo() {
  if (!built_with_cairo()) GTEST_SKIP() << "built without cairo (libcairo2-dev): tg plot draws nothing here";
}

}  // namespace

TEST(Plot, ReadsTheTrainersCurves) {
  const Runs& r = two_runs();
  RunCurves c = read_run_curves(r.fast.string());
  EXPECT_EQ(c.label, "fast");
  ASSERT_EQ(c.metrics["loss"].size(), static_cast<size_t>(STEPS));
  EXPECT_EQ(c.metrics["loss"].front().first, 1);
  EXPECT_EQ(c.metrics["loss"].back().first, STEPS);
  ASSERT_EQ(c.metrics["eval_accuracy"].size(), 3u);  // steps 10, 20, 30
  EXPECT_EQ(c.metrics["eval_accuracy"][1].first, 20);
  EXPECT_FALSE(c.metrics.count("time"));
  EXPECT_FALSE(c.metrics.count("elapsed_s"));
  EXPECT_FALSE(c.metrics.count("epoch"));
  EXPECT_LT(c.metrics["loss"].back().second, c.metrics["loss"].front().second);  // it trained
  std::vector<RunCurves> runs = {c, read_run_curves(r.slow.string())};
  EXPECT_EQ(plot_metrics(runs, {}), (std::vector<std::string>{"loss", "eval_accuracy"}));
  EXPECT_EQ(plot_metrics(runs, {"lr", "loss"}), (std::vector<std::string>{"lr", "loss"}));
}

TEST(Plot, PngHoldsTwoCurvesInTwoColours) {
  require_cairo();
  const Runs& r = two_runs();
  const fs::path png = r.root / "loss.png";
  CliRun run = tg_run({"tg", "plot", r.fast.string(), r.slow.string(), "--metric", "loss", "-o", png.string()});
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_EQ(run.out, "wrote " + png.string() + " (loss of 2 runs)\n");
#ifdef TG_HAVE_CAIRO
  Picture pic = read_png(png);
  EXPECT_EQ(pic.width, 900);
  const size_t first = pic.count(plot_colour(0)), second = pic.count(plot_colour(1));
  // A curve across the 796-pixel-wide panel, 3 pixels wide: over a thousand pixels of its colour
  // (the legend's line is 26 x 3).
  EXPECT_GT(first, 800u);
  EXPECT_GT(second, 800u);
  EXPECT_EQ(pic.count(plot_colour(2)), 0u);  // no third run

  // One run: its colour only.
  const fs::path one = r.root / "one.png";
  ASSERT_EQ(tg_run({"tg", "plot", r.slow.string(), "--metric=loss", "-o", one.string()}).rc, 0);
  Picture single = read_png(one);
  EXPECT_GT(single.count(plot_colour(0)), 800u);
  EXPECT_EQ(single.count(plot_colour(1)), 0u);

  // The default metrics are two panels: loss and eval_accuracy.
  const fs::path both = r.root / "both.png";
  CliRun def = tg_run({"tg", "plot", r.fast.string(), r.slow.string(), "-o", both.string()});
  ASSERT_EQ(def.rc, 0) << def.err;
  EXPECT_NE(def.out.find("(loss, eval_accuracy of 2 runs)"), std::string::npos) << def.out;
  Picture two = read_png(both);
  EXPECT_GT(two.height, pic.height + 250);
  EXPECT_GT(two.count(plot_colour(1)), second + 300);  // the second panel's curve
#endif
}

TEST(Plot, SvgHoldsAStrokePerRunInItsColour) {
  require_cairo();
  const Runs& r = two_runs();
  const fs::path svg = r.root / "loss.svg";
  CliRun run = tg_run({"tg", "plot", r.fast.string(), r.slow.string(), "--metric", "loss", "-o", svg.string()});
  ASSERT_EQ(run.rc, 0) << run.err;
  const std::string text = read_text(svg);
  ASSERT_EQ(text.rfind("<?xml", 0), 0u) << text.substr(0, 100);
  std::vector<Stroke> strokes = svg_strokes(text);
  // each run's curve: one line through its STEPS points (cairo drops points on a straight
  // stretch), from the panel's left edge (x = 80, step 1) to its right edge (x = 876, the last step)
  for (size_t run = 0; run < 2; run++) {
    Stroke curve = longest_stroke(strokes, plot_colour(run));
    EXPECT_GE(curve.line_tos, static_cast<size_t>(STEPS / 2)) << "run " << run;
    EXPECT_LE(curve.line_tos, static_cast<size_t>(STEPS - 1)) << "run " << run;
    EXPECT_NEAR(curve.x_min, 80, 0.01) << "run " << run;
    EXPECT_NEAR(curve.x_max, 876, 0.01) << "run " << run;
  }
  EXPECT_EQ(longest_stroke(strokes, plot_colour(2)).line_tos, 0u);
}

TEST(Plot, BadInputIsNamed) {
  const Runs& r = two_runs();
  auto error_of = [](std::vector<std::string> args) {
    CliRun run = tg_run(std::move(args));
    EXPECT_EQ(run.rc, 1) << run.out;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
    return run.err;
  };
  const std::string out = (r.root / "x.png").string();
  const fs::path missing = r.root / "nope";
  EXPECT_EQ(error_of({"tg", "plot", missing.string(), "-o", out}),
            "error: tg plot: no run directory '" + missing.string() + "'\n");
  const fs::path bare = r.root / "bare";
  fs::create_directories(bare);
  EXPECT_EQ(error_of({"tg", "plot", r.fast.string(), bare.string(), "-o", out}),
            "error: tg plot: '" + bare.string() + "' has no metrics.jsonl (is it a run directory of tg train?)\n");
  std::ofstream(bare / "metrics.jsonl") << "\n";
  EXPECT_EQ(error_of({"tg", "plot", bare.string(), "-o", out}),
            "error: tg plot: '" + (bare / "metrics.jsonl").string() + "' has no records yet\n");
  std::ofstream(bare / "metrics.jsonl") << "{\"type\":\"train\",\"step\":1,\"loss\":2}\nnot json\n";
  EXPECT_EQ(error_of({"tg", "plot", bare.string(), "-o", out}),
            "error: tg plot: " + (bare / "metrics.jsonl").string() + ":2: not a JSON object\n");
  // a last line still being written is left out
  std::ofstream(bare / "metrics.jsonl") << "{\"type\":\"train\",\"step\":1,\"loss\":2}\n{\"type\":\"tra";
  EXPECT_EQ(read_run_curves(bare.string()).metrics["loss"].size(), 1u);
  if (built_with_cairo()) {
    std::string unknown = error_of({"tg", "plot", r.fast.string(), "--metric", "loss,val_los", "-o", out});
    EXPECT_EQ(unknown.rfind("error: tg plot: no run has the metric 'val_los' (their metrics: ", 0), 0u) << unknown;
    EXPECT_NE(unknown.find("eval_accuracy"), std::string::npos) << unknown;
    EXPECT_EQ(error_of({"tg", "plot", r.fast.string(), "-o", (r.root / "x.jpg").string()}),
              "error: tg plot: the output '" + (r.root / "x.jpg").string() + "' must end in .png or .svg\n");
    EXPECT_EQ(error_of({"tg", "plot", r.fast.string(), "--metric", "loss,,lr", "-o", out}),
              "error: tg plot: --metric 'loss,,lr' has an empty name (metrics are separated by one comma)\n");
  } else {
    EXPECT_EQ(error_of({"tg", "plot", r.fast.string(), "-o", out}),
              "error: tg plot: this tg was built without cairo (install libcairo2-dev and configure again)\n");
  }
  EXPECT_NE(error_of({"tg", "plot"}).find("RUN_DIR is required"), std::string::npos);
}
