// tests/io/test_tune.cpp — `strata tune` end to end: a tiny sweep (short points, two engines,
// small file) writes an io: file that the config loader accepts as is and an SVG chart, and a
// folder without room for the test file is refused up front with the sizes in the message.
// The strata binary's path comes as the first argument (meson passes it).
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "io/io_config.h"
#include "tests/support/temp_dir.h"

namespace {

std::string strata_binary;

struct CommandRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

CommandRun run(const std::string& arguments) {
  CommandRun result;
  const std::string command = strata_binary + " " + arguments + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char chunk[4096];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof chunk, pipe)) > 0) result.output.append(chunk, got);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TEST(Tune, TinySweepWritesLoadableConfigAndChart) {
  strata::testing::TempDir dir;
  const std::string svg = dir.file("sweep.svg");
  CommandRun tune = run("tune --dir " + dir.file("drive") + " --size 8MiB --point-seconds 0.05 "
                 "--engines psync,uring --block-sizes 64KiB,1MiB --queue-depths 1,4 --threads 1,2 "
                 "--plot " + svg);
  ASSERT_EQ(tune.exit_code, 0) << tune.output;
  EXPECT_NE(tune.output.find("<- chosen"), std::string::npos) << tune.output;
  EXPECT_NE(tune.output.find("[ 32/32]"), std::string::npos) << "progress lines: " << tune.output;
  strata::Result<strata::io::IoSettings> settings =
      strata::io::load_io_settings_file(dir.file("drive") + "/strata-io.yaml");
  ASSERT_TRUE(settings.ok()) << settings.status().to_string();
  ASSERT_TRUE(settings->read.measured_MBps.has_value());
  EXPECT_GT(*settings->read.measured_MBps, 0.0);
  ASSERT_TRUE(settings->write.measured_MBps.has_value());
  EXPECT_GT(*settings->write.measured_MBps, 0.0);
  EXPECT_TRUE(settings->read.engine == strata::io::Backend::psync ||
              settings->read.engine == strata::io::Backend::uring);
  std::ifstream in(svg);
  std::stringstream chart;
  chart << in.rdbuf();
  EXPECT_EQ(chart.str().rfind("<svg", 0), 0u);
  EXPECT_NE(chart.str().find("</svg>"), std::string::npos);
  EXPECT_NE(chart.str().find("sequential writes"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("drive") + "/strata-tune.data"))
      << "the test file is removed afterwards";
}

TEST(Tune, RefusesWithoutSpaceAndSaysHowMuch) {
  strata::testing::TempDir dir;
  CommandRun tune = run("tune --dir " + dir.file("drive") + " --size 1000TiB");
  EXPECT_NE(tune.exit_code, 0);
  EXPECT_NE(tune.output.find("free"), std::string::npos) << tune.output;
  EXPECT_NE(tune.output.find("needs"), std::string::npos) << tune.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("drive") + "/strata-tune.data"));
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_tune PATH-TO-STRATA\n");
    return 2;
  }
  strata_binary = argv[1];
  return RUN_ALL_TESTS();
}
