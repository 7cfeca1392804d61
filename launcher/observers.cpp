// The progress printer, metrics writer, text log and checkpoint writer (see observers.h).
#include "launcher/observers.h"


#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <sstream>
#include <vector>

#include "tinygrad/error.h"

namespace tg::launcher {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string step_line(const StepEvent& e) {
  std::ostringstream os;
  os << "epoch " << e.epoch << " step " << e.step << "/" << e.total_steps << "  loss " << fmt("%.4f", e.loss)
     << "  lr " << fmt("%.3g", e.lr) << "  ";
  if (e.tokens_per_s > 0) os << fmt("%.0f", e.tokens_per_s) << " tokens/s";
  else os << fmt("%.0f", e.examples_per_s) << " examples/s";
  if (e.mfu) os << "  MFU " << fmt("%.1f", 100 * *e.mfu) << "%";
  return os.str();
}

// "test accuracy 86.02%" or "val loss 1.2345 (perplexity 3.44)".
std::string eval_text(const EvalResult& r, bool percent) {
  if (r.accuracy) return "test accuracy " + (percent ? fmt("%.2f", 100 * *r.accuracy) + "%" : fmt("%.4f", *r.accuracy));
  if (r.loss) return "val loss " + fmt("%.4f", *r.loss) + " (perplexity " + fmt("%.2f", std::exp(*r.loss)) + ")";
  return "no evaluation";
}

// "step 4: update" or "steps 3..4: 1 update" (SkipEvent: the steps read together, how many skipped).
std::string skipped_text(const SkipEvent& e) {
  if (e.first_step == e.last_step) return "step " + std::to_string(e.last_step) + ": update";
  return "steps " + std::to_string(e.first_step) + ".." + std::to_string(e.last_step) + ": " +
         std::to_string(e.skipped) + (e.skipped == 1 ? " update" : " updates");
}

// 75 s -> "01:15", 3725 s -> "1:02:05".
std::string clock_text(double seconds) {
  long long s = std::llround(std::max(0.0, seconds));
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  return buf;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---- ProgressPrinter ----

ProgressPrinter::ProgressPrinter(std::FILE* out, bool tty) : out_(out), tty_(tty) {}

// "00:12<00:48": time since training began (this process) and the estimated time left, from the
// mean time per step so far.
std::string ProgressPrinter::timing(const StepEvent& e) const {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  int64_t done = e.step - first_step_;
  std::string eta = done > 0 ? clock_text(elapsed / static_cast<double>(done) * static_cast<double>(e.total_steps - e.step)) : "?";
  return clock_text(elapsed) + "<" + eta;
}

void ProgressPrinter::end_bar() {
  if (bar_open_) std::fputc('\n', out_);
  bar_open_ = false;
}

void ProgressPrinter::on_train_begin(Trainer& t) {
  const Config& c = t.config();
  std::fprintf(out_, "training %s on %s: %lld steps (%lld per epoch), batch %lld, %s lr %g -> %s\n",
               c.get_string("model.name").c_str(), c.get_string("data.name").c_str(),
               static_cast<long long>(t.total_steps()), static_cast<long long>(t.batches_per_epoch()),
               static_cast<long long>(c.get_int("data.batch_size")), c.get_string("optim.name").c_str(),
               c.get_float("optim.lr"), t.run_dir().c_str());
  if (t.step() > 0) std::fprintf(out_, "resumed at step %lld\n", static_cast<long long>(t.step()));
  last_printed_ = first_step_ = t.step();
  began_ = std::chrono::steady_clock::now();
  std::fflush(out_);
}

void ProgressPrinter::on_step_end(Trainer& t, const StepEvent& e) {
  if (tty_) {
    constexpr int WIDTH = 30;
    int fill = static_cast<int>(WIDTH * e.step / std::max<int64_t>(1, e.total_steps));
    std::string bar(static_cast<size_t>(fill), '#');
    bar.resize(WIDTH, '.');
    std::fprintf(out_, "\r[%s] %s  [%s]\x1b[K", bar.c_str(), step_line(e).c_str(), timing(e).c_str());
    bar_open_ = true;
  } else {
    int64_t every = t.config().get_int("train.print_every");
    if (e.step / every == last_printed_ / every && e.step != e.total_steps) return;
    std::fprintf(out_, "%s  [%s]\n", step_line(e).c_str(), timing(e).c_str());
    last_printed_ = e.step;
  }
  std::fflush(out_);
}

void ProgressPrinter::on_step_skipped(Trainer&, const SkipEvent& e) {
  end_bar();
  std::fprintf(out_, "%s skipped on every rank (non-finite gradient)\n", skipped_text(e).c_str());
  std::fflush(out_);
}

void ProgressPrinter::on_eval(Trainer&, const EvalEvent& e) {
  end_bar();
  std::fprintf(out_, "step %lld: %s (%.1f s)\n", static_cast<long long>(e.step), eval_text(e.result, true).c_str(),
               e.seconds);
  std::fflush(out_);
}

void ProgressPrinter::on_checkpoint(Trainer&, const CheckpointEvent& e) {
  end_bar();
  std::fprintf(out_, "checkpoint %s\n", e.path.c_str());
  std::fflush(out_);
}

void ProgressPrinter::on_train_end(Trainer&, const TrainSummary& s) {
  end_bar();
  std::fprintf(out_, "done: %lld steps in %.1f s", static_cast<long long>(s.steps), s.seconds);
  if (s.accuracy || s.val_loss) std::fprintf(out_, ", %s", eval_text({s.accuracy, s.val_loss}, true).c_str());
  std::fprintf(out_, "\n");
  std::fflush(out_);
}

// ---- MetricsWriter ----

MetricsWriter::MetricsWriter(std::string path) : path_(std::move(path)) {}

void MetricsWriter::on_train_begin(Trainer& t) {
  if (t.step() > 0) {
    // Resumed: keep the records up to the checkpoint's step, drop what came after it.
    std::vector<std::string> keep;
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains("step") && j["step"].is_number() && j["step"].get<int64_t>() <= t.step())
        keep.push_back(line);
    }
    in.close();
    std::ofstream rewrite(path_, std::ios::trunc);
    for (const auto& l : keep) rewrite << l << "\n";
  }
  out_.open(path_, std::ios::app);
  TG_CHECK(out_, "metrics: cannot write '", path_, "'");
  elapsed_before_ = t.step() > 0 ? last_elapsed_s(path_) : 0.0;
  began_ = std::chrono::steady_clock::now();
  for (auto& sink : sinks_) sink->begin(t.step());
}

// The elapsed_s of the file's last record that has one (0 when none): where a resumed run's
// elapsed time continues from.
double MetricsWriter::last_elapsed_s(const std::string& path) {
  double last = 0;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("elapsed_s") && j["elapsed_s"].is_number()) last = j["elapsed_s"].get<double>();
  }
  return last;
}

void MetricsWriter::write(nlohmann::json record) {
  double elapsed = elapsed_before_ + std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
  record["time"] = std::round(unix_seconds() * 1000) / 1000;
  record["elapsed_s"] = std::round(elapsed * 1000) / 1000;
  out_ << record.dump() << "\n";
  out_.flush();
  for (auto& sink : sinks_) sink->write(record);
}

void MetricsWriter::on_step_end(Trainer&, const StepEvent& e) {
  nlohmann::json j{{"type", "train"},
                   {"step", e.step},
                   {"epoch", e.epoch},
                   {"loss", e.loss},
                   {"lr", e.lr},
                   {"examples_per_s", std::round(e.examples_per_s * 10) / 10}};
  if (e.tokens_per_s > 0) j["tokens_per_s"] = std::round(e.tokens_per_s);
  if (e.mfu) j["mfu"] = std::round(*e.mfu * 1e4) / 1e4;
  if (e.grad_norm) j["grad_norm"] = *e.grad_norm;
  write(j);
}

void MetricsWriter::on_step_skipped(Trainer&, const SkipEvent& e) {
  write(nlohmann::json{{"type", "skip"}, {"step", e.last_step}, {"first_step", e.first_step}, {"skipped", e.skipped}});
}

void MetricsWriter::on_eval(Trainer&, const EvalEvent& e) {
  nlohmann::json j{{"type", "eval"}, {"step", e.step}, {"epoch", e.epoch}};
  if (e.result.accuracy) j["eval_accuracy"] = *e.result.accuracy;
  if (e.result.loss) j["val_loss"] = *e.result.loss, j["perplexity"] = std::exp(*e.result.loss);
  j["eval_seconds"] = std::round(e.seconds * 1000) / 1000;
  write(j);
}

void MetricsWriter::on_checkpoint(Trainer&, const CheckpointEvent& e) {
  write(nlohmann::json{{"type", "checkpoint"}, {"step", e.step}, {"epoch", e.epoch}, {"path", e.path}});
}

// ---- TrainLog ----

TrainLog::TrainLog(std::string path) : out_(std::make_unique<FileLog>(path)) {}

void TrainLog::line(const std::string& text) { out_->line(text); }

void TrainLog::on_train_begin(Trainer& t) {
  std::ostringstream os;
  os << (t.step() > 0 ? "resume at step " + std::to_string(t.step()) : std::string("start")) << ": model "
     << t.config().get_string("model.name") << " (" << t.model().num_parameters() << " parameters), "
     << t.total_steps() << " steps, " << t.batches_per_epoch() << " batches per epoch";
  line(os.str());
}

void TrainLog::on_step_end(Trainer&, const StepEvent& e) { line(step_line(e)); }

void TrainLog::on_step_skipped(Trainer&, const SkipEvent& e) {
  line(skipped_text(e) + " skipped on every rank (non-finite gradient)");
}

void TrainLog::on_eval(Trainer&, const EvalEvent& e) {
  line("step " + std::to_string(e.step) + ": " + eval_text(e.result, false));
}

void TrainLog::on_checkpoint(Trainer&, const CheckpointEvent& e) { line("checkpoint " + e.path); }

void TrainLog::on_train_end(Trainer&, const TrainSummary& s) {
  line("done: " + std::to_string(s.steps) + " steps in " + fmt("%.1f", s.seconds) + " s" +
       (s.accuracy || s.val_loss ? ", " + eval_text({s.accuracy, s.val_loss}, false) : std::string()));
}

// ---- CheckpointWriter ----

void CheckpointWriter::on_train_begin(Trainer& t) { written_step_ = t.step() > 0 ? t.step() : -1; }

void CheckpointWriter::on_step(Trainer& t, int64_t step) {
  int64_t every = t.config().get_int("train.checkpoint_every");
  if (every > 0 && step % every == 0) {
    t.save_checkpoint();
    written_step_ = step;
  }
}

void CheckpointWriter::on_train_end(Trainer& t, const TrainSummary&) {
  if (written_step_ != t.step() && t.step() > 0) {
    t.save_checkpoint();
    written_step_ = t.step();
  }
}

}  // namespace tg::launcher
