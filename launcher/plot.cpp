// `tg plot` (see plot.h): runs' metrics.jsonl read into curves, and a figure of one panel per
// metric drawn with cairo (an image surface written as PNG, or an SVG surface).
#include "launcher/plot.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tinygrad/error.h"

#ifdef TG_HAVE_CAIRO
#include <cairo.h>
#if CAIRO_HAS_SVG_SURFACE
#include <cairo-svg.h>
#endif
#endif

namespace fs = std::filesystem;

namespace tg::launcher {

namespace {

// Keys of a record that are no metric: where and when it was written.
bool is_metric_key(const std::string& key) {
  return key != "step" && key != "epoch" && key != "time" && key != "elapsed_s" && key != "type";
}

std::string run_label(const std::string& dir) {
  fs::path p(dir);
  if (p.filename().empty()) p = p.parent_path();  // "runs/a/"
  return p.filename().empty() ? dir : p.filename().string();
}

// The lines of a file; a last line without its newline (a record being written) is left out.
std::vector<std::string> complete_lines(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  TG_CHECK(in.good(), "tg plot: cannot read '", file.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) break;
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> metric_names(const std::vector<RunCurves>& runs) {
  std::set<std::string> names;
  for (const auto& r : runs)
    for (const auto& [name, points] : r.metrics) names.insert(name);
  return {names.begin(), names.end()};
}

bool some_run_has(const std::vector<RunCurves>& runs, const std::string& metric) {
  for (const auto& r : runs)
    if (r.metrics.count(metric)) return true;
  return false;
}

}  // namespace

RunCurves read_run_curves(const std::string& run_dir) {
  TG_CHECK(fs::is_directory(run_dir), "tg plot: no run directory '", run_dir, "'");
  const fs::path file = fs::path(run_dir) / "metrics.jsonl";
  TG_CHECK(fs::is_regular_file(file), "tg plot: '", run_dir, "' has no metrics.jsonl (is it a run directory of tg train?)");
  RunCurves run{run_dir, run_label(run_dir), {}};
  size_t records = 0, line_no = 0;
  for (const auto& line : complete_lines(file)) {
    line_no++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    TG_CHECK(!j.is_discarded() && j.is_object(), "tg plot: ", file.string(), ":", line_no, ": not a JSON object");
    if (!j.contains("step") || !j["step"].is_number()) continue;
    records++;
    const double step = j["step"].get<double>();
    for (auto& [key, value] : j.items()) {
      if (!is_metric_key(key) || !value.is_number()) continue;
      const double v = value.get<double>();
      if (std::isfinite(v)) run.metrics[key].emplace_back(step, v);
    }
  }
  TG_CHECK(records > 0, "tg plot: '", file.string(), "' has no records yet");
  return run;
}

std::vector<std::string> plot_metrics(const std::vector<RunCurves>& runs, const std::vector<std::string>& wanted) {
  const std::vector<std::string> have = metric_names(runs);
  if (wanted.empty()) {
    std::vector<std::string> out;
    for (const char* m : {"loss", "val_loss", "eval_accuracy"})
      if (some_run_has(runs, m)) out.push_back(m);
    TG_CHECK(!out.empty(), "tg plot: the runs have none of loss, val_loss, eval_accuracy (their metrics: ", joined(have),
             "); choose with --metric");
    return out;
  }
  for (const auto& m : wanted)
    TG_CHECK(some_run_has(runs, m), "tg plot: no run has the metric '", m, "' (their metrics: ", joined(have), ")");
  return wanted;
}

std::array<uint8_t, 3> plot_colour(size_t run_index) {
  // matplotlib's "tab10"
  static const std::array<std::array<uint8_t, 3>, 10> palette = {{{0x1f, 0x77, 0xb4},
                                                                  {0xff, 0x7f, 0x0e},
                                                                  {0x2c, 0xa0, 0x2c},
                                                                  {0xd6, 0x27, 0x28},
                                                                  {0x94, 0x67, 0xbd},
                                                                  {0x8c, 0x56, 0x4b},
                                                                  {0xe3, 0x77, 0xc2},
                                                                  {0x7f, 0x7f, 0x7f},
                                                                  {0xbc, 0xbd, 0x22},
                                                                  {0x17, 0xbe, 0xcf}}};
  return palette[run_index % palette.size()];
}

std::array<uint8_t, 3> category_colour(const std::string& category) {
  // Tableau's 10, one per kind of span; an unknown kind is grey.
  static const std::map<std::string, std::array<uint8_t, 3>> colours = {
      {"kernel", {0x4e, 0x79, 0xa7}},   {"collective", {0xf2, 0x8e, 0x2b}}, {"wait", {0xe1, 0x57, 0x59}},
      {"queue", {0xba, 0xb0, 0xac}},    {"jit", {0x59, 0xa1, 0x4f}},        {"step", {0xd9, 0xd9, 0xd9}},
      {"data", {0xb0, 0x7a, 0xa1}},     {"schedule", {0x9c, 0x75, 0x5f}},   {"compile", {0xff, 0x9d, 0xa7}},
      {"copy", {0x76, 0xb7, 0xb2}},     {"eval", {0xed, 0xc9, 0x48}},       {"checkpoint", {0x8c, 0xd1, 0x7d}}};
  auto it = colours.find(category);
  return it != colours.end() ? it->second : std::array<uint8_t, 3>{0x99, 0x99, 0x99};
}

#ifdef TG_HAVE_CAIRO

bool built_with_cairo() { return true; }
std::string cairo_status() { return std::string("cairo ") + cairo_version_string(); }

namespace {

// About `target` ticks at 1, 2 or 5 times a power of ten, inside [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  std::vector<double> ticks;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return ticks;
}

std::string tick_label(double v) {
  std::ostringstream os;
  os << std::setprecision(6) << v;
  return os.str();
}

struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  // A range to draw: a margin of 5% on both sides (y), or some width where all values are one.
  Range padded(double margin) const {
    if (hi > lo) return {lo - (hi - lo) * margin, hi + (hi - lo) * margin};
    double w = lo != 0 ? std::abs(lo) * 0.1 : 1.0;
    return {lo - w, hi + w};
  }
};

struct Box {
  double left, top, right, bottom;
  double x(const Range& r, double v) const { return left + (v - r.lo) / (r.hi - r.lo) * (right - left); }
  double y(const Range& r, double v) const { return bottom - (v - r.lo) / (r.hi - r.lo) * (bottom - top); }
};

using Surface = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using Context = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

void set_rgb(cairo_t* cr, std::array<uint8_t, 3> c) { cairo_set_source_rgb(cr, c[0] / 255.0, c[1] / 255.0, c[2] / 255.0); }

void text_at(cairo_t* cr, double x, double y, const std::string& s, double size, bool bold = false, double align = 0) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t ext;
  cairo_text_extents(cr, s.c_str(), &ext);
  cairo_move_to(cr, x - align * ext.x_advance, y);
  cairo_show_text(cr, s.c_str());
}

const int LEGEND_ROW = 22, LEGEND_TOP = 10;
const int CURVE_WIDTH = 3;  // wide enough that a curve's inner pixels hold its colour exactly

// Rows of the legend: the runs' labels after a line in their colour, wrapped at the width.
int draw_legend(cairo_t* cr, const std::vector<RunCurves>& runs, int width, bool draw) {
  double x = 80, y = LEGEND_TOP + 14;
  int rows = 1;
  for (size_t i = 0; i < runs.size(); i++) {
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    cairo_text_extents_t ext;
    cairo_text_extents(cr, runs[i].label.c_str(), &ext);
    const double item = 34 + ext.x_advance + 18;
    if (x + item > width - 10 && x > 80) {
      x = 80;
      y += LEGEND_ROW;
      rows++;
    }
    if (draw) {
      set_rgb(cr, plot_colour(i));
      cairo_set_line_width(cr, CURVE_WIDTH);
      cairo_move_to(cr, x, y - 4);
      cairo_line_to(cr, x + 26, y - 4);
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
      text_at(cr, x + 34, y, runs[i].label, 12);
    }
    x += item;
  }
  return rows;
}

void draw_axes(cairo_t* cr, const Box& b, const Range& xr, const Range& yr) {
  cairo_set_line_width(cr, 1);
  for (double t : nice_ticks(yr.lo, yr.hi)) {
    const double y = std::round(b.y(yr, t)) + 0.5;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, b.left, y);
    cairo_line_to(cr, b.right, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    text_at(cr, b.left - 6, y + 4, tick_label(t), 11, false, 1.0);
  }
  for (double t : nice_ticks(xr.lo, xr.hi)) {
    const double x = std::round(b.x(xr, t)) + 0.5;
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, x, b.top);
    cairo_line_to(cr, x, b.bottom);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    cairo_move_to(cr, x, b.bottom);
    cairo_line_to(cr, x, b.bottom + 4);
    cairo_stroke(cr);
    text_at(cr, x, b.bottom + 17, tick_label(t), 11, false, 0.5);
  }
  cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
  cairo_rectangle(cr, b.left + 0.5, b.top + 0.5, b.right - b.left - 1, b.bottom - b.top - 1);
  cairo_stroke(cr);
}

void draw_curve(cairo_t* cr, const Box& b, const Range& xr, const Range& yr,
                const std::vector<std::pair<double, double>>& points, std::array<uint8_t, 3> colour) {
  set_rgb(cr, colour);
  if (points.size() == 1) {  // one point: a dot
    cairo_arc(cr, b.x(xr, points[0].first), b.y(yr, points[0].second), 4, 0, 2 * M_PI);
    cairo_fill(cr);
    return;
  }
  cairo_set_line_width(cr, CURVE_WIDTH);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
  for (size_t i = 0; i < points.size(); i++) {
    const double x = b.x(xr, points[i].first), y = b.y(yr, points[i].second);
    if (i == 0) cairo_move_to(cr, x, y);
    else cairo_line_to(cr, x, y);
  }
  cairo_stroke(cr);
}

// One metric's panel: its name, the grid with tick labels, every run's curve (clipped to the box).
void draw_panel(cairo_t* cr, const std::vector<RunCurves>& runs, const std::string& metric, double top, int width,
                int height) {
  Range xr, yr;
  for (const auto& r : runs)
    if (auto it = r.metrics.find(metric); it != r.metrics.end())
      for (auto [x, y] : it->second) {
        xr.add(x);
        yr.add(y);
      }
  xr = xr.padded(0);
  yr = yr.padded(0.05);
  const Box box{80, top + 28, static_cast<double>(width - 24), top + height - 38};
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  text_at(cr, box.left, top + 18, metric, 14, true);
  draw_axes(cr, box, xr, yr);
  text_at(cr, (box.left + box.right) / 2, box.bottom + 32, "step", 11, false, 0.5);
  cairo_save(cr);
  cairo_rectangle(cr, box.left, box.top, box.right - box.left, box.bottom - box.top);
  cairo_clip(cr);
  for (size_t i = 0; i < runs.size(); i++)
    if (auto it = runs[i].metrics.find(metric); it != runs[i].metrics.end())
      draw_curve(cr, box, xr, yr, it->second, plot_colour(i));
  cairo_restore(cr);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

void check_cairo(cairo_status_t status, const std::string& path) {
  TG_CHECK(status == CAIRO_STATUS_SUCCESS, "tg plot: cannot write '", path, "': ", cairo_status_to_string(status));
}

// A surface for `out` (an SVG file, or an image written as PNG by finish()).
struct Canvas {
  std::string out;
  bool svg;
  Surface surface{nullptr, cairo_surface_destroy};
  Canvas(std::string path, int width, int height) : out(std::move(path)), svg(ends_with(out, ".svg")) {
    TG_CHECK(svg || ends_with(out, ".png"), "tg plot: the output '", out, "' must end in .png or .svg");
#if CAIRO_HAS_SVG_SURFACE
    if (svg) surface.reset(cairo_svg_surface_create(out.c_str(), width, height));
#else
    TG_CHECK(!svg, "tg plot: this cairo has no SVG surface; write a .png");
#endif
    if (!svg) surface.reset(cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height));
    check_cairo(cairo_surface_status(surface.get()), out);
  }
  void finish() {
    if (!svg) check_cairo(cairo_surface_write_to_png(surface.get(), out.c_str()), out);
    cairo_surface_finish(surface.get());
    check_cairo(cairo_surface_status(surface.get()), out);
  }
};

// ---- the timeline ----

const int TL_LEFT = 170, TL_ROW = 16, TL_LANE_GAP = 6, TL_TOP = 58;

struct PlacedSpan {
  const TimelineSpan* span;
  int depth;
};

// Each lane's spans in the window with their nesting depth (a span inside another one row lower).
std::map<std::pair<int, int>, std::vector<PlacedSpan>> place_spans(const Timeline& t) {
  std::map<std::pair<int, int>, std::vector<const TimelineSpan*>> lanes;
  for (const auto& s : t.spans)
    if (s.ts_us < t.to_us && s.ts_us + s.dur_us > t.from_us) lanes[{s.pid, s.tid}].push_back(&s);
  std::map<std::pair<int, int>, std::vector<PlacedSpan>> out;
  for (auto& [lane, spans] : lanes) {
    std::stable_sort(spans.begin(), spans.end(), [](const TimelineSpan* a, const TimelineSpan* b) {
      return a->ts_us != b->ts_us ? a->ts_us < b->ts_us : a->dur_us > b->dur_us;
    });
    std::vector<double> open_ends;  // the enclosing spans' ends
    for (const TimelineSpan* s : spans) {
      while (!open_ends.empty() && open_ends.back() <= s->ts_us) open_ends.pop_back();
      out[lane].push_back({s, static_cast<int>(open_ends.size())});
      open_ends.push_back(s->ts_us + s->dur_us);
    }
  }
  return out;
}

int lane_height(const std::vector<PlacedSpan>& spans) {
  int depth = 0;
  for (const auto& p : spans) depth = std::max(depth, p.depth);
  return (depth + 1) * TL_ROW + TL_LANE_GAP;
}

void draw_span(cairo_t* cr, const PlacedSpan& p, double x0, double x1, double y) {
  set_rgb(cr, category_colour(p.span->category));
  cairo_rectangle(cr, x0, y, std::max(x1 - x0, 1.0), TL_ROW - 2);
  cairo_fill(cr);
  if (x1 - x0 < 40) return;
  cairo_save(cr);
  cairo_rectangle(cr, x0, y, x1 - x0 - 2, TL_ROW - 2);
  cairo_clip(cr);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  text_at(cr, x0 + 2, y + TL_ROW - 5, p.span->name, 10);
  cairo_restore(cr);
}

void draw_time_axis(cairo_t* cr, const Timeline& t, int width, int height) {
  const double ms = (t.to_us - t.from_us) / 1e3, w = width - TL_LEFT - 10;
  cairo_set_line_width(cr, 1);
  for (double tick : nice_ticks(0, ms, 8)) {
    const double x = std::round(TL_LEFT + tick / ms * w) + 0.5;
    cairo_set_source_rgb(cr, 0.92, 0.92, 0.92);
    cairo_move_to(cr, x, TL_TOP - 4);
    cairo_line_to(cr, x, height - 4);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.25, 0.25, 0.25);
    text_at(cr, x, TL_TOP - 8, tick_label(tick) + " ms", 10, false, 0.5);
  }
}

void draw_categories(cairo_t* cr, const Timeline& t) {
  std::set<std::string> cats;
  for (const auto& s : t.spans)
    if (s.ts_us < t.to_us && s.ts_us + s.dur_us > t.from_us) cats.insert(s.category);
  double x = TL_LEFT;
  for (const auto& c : cats) {
    set_rgb(cr, category_colour(c));
    cairo_rectangle(cr, x, 26, 12, 10);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    text_at(cr, x + 16, 35, c, 11);
    x += 30 + 7 * static_cast<double>(c.size());
  }
}

}  // namespace

void draw_timeline(const Timeline& t, const std::string& out, int width) {
  TG_CHECK(t.to_us > t.from_us, "tg trace plot: an empty time window");
  const auto lanes = place_spans(t);
  TG_CHECK(!lanes.empty(), "tg trace plot: no span in the window");
  int height = TL_TOP + 6;
  for (const auto& [lane, spans] : lanes) height += lane_height(spans);
  Canvas canvas(out, width, height);
  {
    Context cr(cairo_create(canvas.surface.get()), cairo_destroy);
    cairo_t* c = cr.get();
    cairo_set_source_rgb(c, 1, 1, 1);
    cairo_paint(c);
    cairo_set_source_rgb(c, 0.1, 0.1, 0.1);
    text_at(c, 10, 18, t.title, 13, true);
    draw_categories(c, t);
    draw_time_axis(c, t, width, height);
    const double scale = (width - TL_LEFT - 10) / (t.to_us - t.from_us);
    double y = TL_TOP;
    for (const auto& [lane, spans] : lanes) {
      cairo_set_source_rgb(c, 0.8, 0.8, 0.8);
      cairo_set_line_width(c, 1);
      cairo_move_to(c, 0, std::round(y) - 2.5);
      cairo_line_to(c, width, std::round(y) - 2.5);
      cairo_stroke(c);
      cairo_set_source_rgb(c, 0.15, 0.15, 0.15);
      auto name = t.lane_names.find(lane);
      text_at(c, 8, y + TL_ROW - 5,
              name != t.lane_names.end() ? name->second : "rank " + std::to_string(lane.first) + " thread " +
                                                              std::to_string(lane.second),
              11);
      for (const auto& p : spans) {
        const double x0 = TL_LEFT + (std::max(p.span->ts_us, t.from_us) - t.from_us) * scale;
        const double x1 = TL_LEFT + (std::min(p.span->ts_us + p.span->dur_us, t.to_us) - t.from_us) * scale;
        draw_span(c, p, x0, x1, y + p.depth * TL_ROW);
      }
      y += lane_height(spans);
    }
    check_cairo(cairo_status(c), out);
  }
  canvas.finish();
}

std::vector<std::string> plot_runs(const PlotRequest& req) {
  TG_CHECK(!req.run_dirs.empty(), "tg plot: no run directory given");
  TG_CHECK(ends_with(req.out, ".svg") || ends_with(req.out, ".png"), "tg plot: the output '", req.out,
           "' must end in .png or .svg");
  std::vector<RunCurves> runs;
  for (const auto& d : req.run_dirs) runs.push_back(read_run_curves(d));
  std::map<std::string, int> label_uses;
  for (const auto& r : runs) label_uses[r.label]++;
  for (auto& r : runs)
    if (label_uses[r.label] > 1) r.label = r.dir;  // two runs of one name: their paths
  const std::vector<std::string> metrics = plot_metrics(runs, req.metrics);

  // The legend's height depends on the labels' widths, measured on a scratch surface.
  Surface scratch(cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 1, 1), cairo_surface_destroy);
  Context measure(cairo_create(scratch.get()), cairo_destroy);
  const int legend_height = LEGEND_TOP + LEGEND_ROW * draw_legend(measure.get(), runs, req.width, false) + 6;
  const int height = legend_height + req.panel_height * static_cast<int>(metrics.size()) + 8;

  Canvas canvas(req.out, req.width, height);
  {
    Context cr(cairo_create(canvas.surface.get()), cairo_destroy);
    cairo_set_source_rgb(cr.get(), 1, 1, 1);
    cairo_paint(cr.get());
    draw_legend(cr.get(), runs, req.width, true);
    for (size_t m = 0; m < metrics.size(); m++)
      draw_panel(cr.get(), runs, metrics[m], legend_height + static_cast<double>(m) * req.panel_height, req.width,
                 req.panel_height);
    check_cairo(cairo_status(cr.get()), req.out);
  }
  canvas.finish();
  return metrics;
}

#else  // no cairo

bool built_with_cairo() { return false; }
std::string cairo_status() { return "not built (needs cairo: libcairo2-dev)"; }

std::vector<std::string> plot_runs(const PlotRequest&) {
  TG_FAIL("tg plot: this tg was built without cairo (install libcairo2-dev and configure again)");
}

void draw_timeline(const Timeline&, const std::string&, int) {
  TG_FAIL("tg trace plot: this tg was built without cairo (install libcairo2-dev and configure again)");
}

#endif

}  // namespace tg::launcher
