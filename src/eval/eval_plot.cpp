// Perplexity-versus-length plot through gnuplot (Debian's gnuplot-nox): the gnuplot program is
// generated here, once, for pope-eval --plot and scripts/plot_lengths.sh (which calls
// pope-eval --plot-csv), so that the two can never draw differently.
#include <fmt/format.h>
#include <fmt/std.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>

#include "pope/eval.hpp"

namespace pope {

namespace fs = std::filesystem;

bool gnuplot_available() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((fs::path(dir) / "gnuplot").c_str(), X_OK) == 0) return true;
  return false;
}

namespace {

// A double-quoted gnuplot string (terminal in noenhanced mode, so only \ and " need care).
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string gnuplot_program(const std::vector<EvalCurve>& curves, const fs::path& output, int train_length) {
  std::string program =
      "set terminal pngcairo size 1000,650 noenhanced font \",11\"\n"
      "set output " + quoted(output.string()) + "\n"
      "set logscale y\nset grid xtics ytics mytics\nset key top left box opaque\n"
      "set xlabel \"evaluation length (tokens)\"\nset ylabel \"perplexity (log scale)\"\n"
      "set title \"Perplexity versus evaluation length (dashed: training length)\"\n";
  std::set<int> marks;
  if (train_length > 0) marks.insert(train_length);
  else
    for (const EvalCurve& c : curves)
      if (c.train_length > 0) marks.insert(c.train_length);
  for (int mark : marks)
    program += fmt::format("set arrow from {0}, graph 0 to {0}, graph 1 nohead dashtype 2 linecolor rgb \"gray40\"\n",
                           mark);

  std::string plot = "plot ";
  int plotted = 0;
  for (std::size_t i = 0; i < curves.size(); ++i) {
    program += fmt::format("$curve{} << EOD\n", i);
    int points = 0;
    for (const LengthResult& r : curves[i].results)
      if (std::isfinite(r.perplexity())) {
        program += fmt::format("{} {}\n", r.length, r.perplexity());
        ++points;
      }
    program += "EOD\n";
    if (points == 0) continue;  // every length was longer than every book
    plot += fmt::format("{}$curve{} using 1:2 with linespoints linewidth 2 title {}", plotted++ ? ", " : "", i,
                        quoted(curves[i].label));
  }
  if (plotted == 0) throw std::runtime_error("nothing to plot: no curve has a finite perplexity at any length");
  return program + plot + "\n";
}

}  // namespace

void plot_curves(const std::vector<EvalCurve>& curves, const fs::path& png, int train_length) {
  if (!gnuplot_available())
    throw std::runtime_error(fmt::format("--plot {}: gnuplot is not installed (Debian: apt-get install gnuplot-nox, "
                                         "see scripts/setup.sh); write --csv and plot it elsewhere with "
                                         "scripts/plot_lengths.sh",
                                         png));
  // gnuplot writes a temporary file that is renamed over the target: a reader never sees a
  // half-written PNG.
  const fs::path target = fs::absolute(png);
  const fs::path temp = target.string() + ".tmp.png";
  const std::string program = gnuplot_program(curves, temp, train_length);

  char log_name[] = "/tmp/pope_gnuplot.XXXXXX";
  const int log_fd = ::mkstemp(log_name);
  if (log_fd < 0) throw std::runtime_error("--plot: cannot create a temporary file for gnuplot's messages");
  ::close(log_fd);
  FILE* pipe = ::popen(fmt::format("gnuplot 2>'{}'", log_name).c_str(), "w");
  if (!pipe) {
    ::unlink(log_name);
    throw std::runtime_error("--plot: cannot start gnuplot");
  }
  std::fwrite(program.data(), 1, program.size(), pipe);
  const int status = ::pclose(pipe);
  std::ifstream log(log_name);
  const std::string messages((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  ::unlink(log_name);
  std::error_code ignored;
  if (status != 0 || !fs::is_regular_file(temp) || fs::file_size(temp, ignored) == 0) {
    fs::remove(temp, ignored);
    throw std::runtime_error(fmt::format("--plot {}: gnuplot failed (status {}): {}", png, status, messages));
  }
  fs::rename(temp, target);
}

}  // namespace pope
