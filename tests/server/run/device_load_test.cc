// DeviceLoad: requests' bare "cuda" and "sim" spread over the devices, least loaded first, ties
// in turn (Note [Bare device names]).

#include "server/run/device_load.h"

#include <optional>
#include <vector>

#include "engine/device/device.h"
#include "gtest/gtest.h"

namespace gradserve::server {
namespace {

TEST(DeviceLoadTest, TheLeastLoadedDeviceAndTiesInTurn) {
  DeviceLoad load(/*gpus=*/3, /*sims=*/2);
  std::optional<DeviceLoad::Lease> a(load.Acquire());
  std::optional<DeviceLoad::Lease> b(load.Acquire());
  EXPECT_EQ(a->choice().cuda, 0);
  EXPECT_EQ(b->choice().cuda, 1);
  EXPECT_EQ(a->choice().sim, 0);
  EXPECT_EQ(b->choice().sim, 1);
  EXPECT_EQ(load.GpuLeases(), (std::vector<int64_t>{1, 1, 0}));
  {
    const DeviceLoad::Lease c = load.Acquire();  // the idle GPU; the simulated ones tie
    EXPECT_EQ(c.choice().cuda, 2);
    EXPECT_EQ(c.choice().sim, 0);
    EXPECT_EQ(load.GpuLeases(), (std::vector<int64_t>{1, 1, 1}));
  }
  a.reset();  // cuda:0 and sim:0 free again: the least loaded
  const DeviceLoad::Lease d = load.Acquire();
  EXPECT_EQ(d.choice().cuda, 0);
  EXPECT_EQ(d.choice().sim, 0);
  b.reset();
  EXPECT_EQ(load.GpuLeases(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(load.SimulatedLeases(), (std::vector<int64_t>{1, 0}));
}

TEST(DeviceLoadTest, SequentialRequestsTakeTurns) {
  DeviceLoad load(/*gpus=*/2, /*sims=*/0);
  std::vector<int> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(load.Acquire().choice().cuda);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(load.GpuLeases(), (std::vector<int64_t>{0, 0}));
}

TEST(DeviceLoadTest, HoldCountsAGivenChoiceAndNoDevicesMeansIndexZero) {
  DeviceLoad load(/*gpus=*/2, /*sims=*/0);
  {
    const DeviceLoad::Lease session_call = load.Hold({.cuda = 1, .sim = 0});
    EXPECT_EQ(load.GpuLeases(), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(load.Acquire().choice().cuda, 0);  // the other one
  }
  EXPECT_EQ(load.GpuLeases(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(load.Acquire().choice().sim, 0);
  DeviceLoad none(0, 0);
  EXPECT_EQ(none.Acquire().choice(), DeviceChoice{});
  // One GPU: nothing to choose, nothing counted.
  DeviceLoad one(1, 1);
  const DeviceLoad::Lease held = one.Acquire();
  EXPECT_EQ(held.choice(), DeviceChoice{});
  EXPECT_EQ(one.GpuLeases(), (std::vector<int64_t>{0}));
}

TEST(DeviceChoiceTest, BareNamesParseToTheThreadsChoice) {
  EXPECT_EQ(ParseDevice("cuda").value(), (Device{DeviceType::kCUDA, 0}));
  {
    DeviceChoiceScope scope({.cuda = 2, .sim = 1});
    EXPECT_EQ(ParseDevice("cuda").value(), (Device{DeviceType::kCUDA, 2}));
    EXPECT_EQ(ParseDevice("sim").value(), (Device{DeviceType::kSimulated, 1}));
    EXPECT_EQ(ParseDevice("cuda:0").value(), (Device{DeviceType::kCUDA, 0}));  // named: as is
    EXPECT_EQ(ParseDevice("cpu").value(), kCPU);
  }
  EXPECT_EQ(ParseDevice("sim").value(), (Device{DeviceType::kSimulated, 0}));
}

}  // namespace
}  // namespace gradserve::server
