// `tg plot RUN_DIR... [--metric loss,val_loss] [-o FILE.png|FILE.svg]`: the curves of one or
// several runs' metrics.jsonl, overlaid in one panel per metric (x: step), drawn with cairo into a
// PNG or an SVG file.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tg::launcher {

// A run's metrics as curves: every numeric key of its metrics.jsonl records but step, epoch and
// the times, as (step, value) points in the order of the records.
struct RunCurves {
  std::string dir;
  std::string label;  // the run directory's name (its path where two runs share a name)
  std::map<std::string, std::vector<std::pair<double, double>>> metrics;
};

// Reads RUN_DIR/metrics.jsonl. An error names a missing directory or file, a line that is no JSON
// object, and a file without records.
RunCurves read_run_curves(const std::string& run_dir);

struct PlotRequest {
  std::vector<std::string> run_dirs;
  std::vector<std::string> metrics;  // empty: loss and the evaluation metrics the runs have
  std::string out = "plot.png";      // .png or .svg
  int width = 900;
  int panel_height = 300;
};

// The metrics a plot of `runs` shows: `wanted`, each of which some run must have (an error names
// an unknown one and the metrics the runs have), or by default loss, val_loss and eval_accuracy,
// those that some run has.
std::vector<std::string> plot_metrics(const std::vector<RunCurves>& runs, const std::vector<std::string>& wanted);

// Draws the plot and writes it to req.out; returns the metrics drawn. An error when the build has
// no cairo (built_with_cairo()), when the file type is neither .png nor .svg, or as above.
std::vector<std::string> plot_runs(const PlotRequest& req);

// A timeline to draw (`tg trace plot`): spans on lanes, a lane per (pid, tid).
struct TimelineSpan {
  int pid = 0, tid = 0;
  std::string name, category;
  double ts_us = 0, dur_us = 0;
};
struct Timeline {
  std::vector<TimelineSpan> spans;
  std::map<std::pair<int, int>, std::string> lane_names;  // "rank 0 main", ...
  double from_us = 0, to_us = 0;                          // the window drawn
  std::string title;
};
// Draws the lanes that have spans in the window, a row per nesting depth, each span a box in its
// category's colour (named inside where it is wide enough), a time axis in ms from the window's
// start, and a legend of the categories; writes out (.png or .svg).
void draw_timeline(const Timeline& t, const std::string& out, int width = 1200);
// The colour of a category's boxes (8-bit RGB).
std::array<uint8_t, 3> category_colour(const std::string& category);

bool built_with_cairo();
std::string cairo_status();  // "cairo 1.16.0", or why plots are not built

// The colour of the i-th run's curves (8-bit RGB; a palette of 10, then again).
std::array<uint8_t, 3> plot_colour(size_t run_index);

}  // namespace tg::launcher
