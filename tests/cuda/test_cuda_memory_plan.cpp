// The memory plan against the CUDA allocator: `tandem bench train --device cuda` prints the plan's peak beside the
// peak of tensors held at once over its timed steps (a recorded step's own pool counted). A small GPT and Llama in
// bf16 — 16-bit activations, the weights' kept 16-bit copies, cuDNN's fused attention where the build has it (the
// plan asks the backend which attention runs), padded rows before the GPT's biased products — recompute none and
// full, recorded and eager: each within 10%. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "e2e/cli_util.h"
#include "tandem/device.h"

using tandem::test::result_of;
using tandem::test::run_tandem;

TEST(CudaMemoryPlan, PlanMatchesTheAllocatorsPeakInBf16) {
  if (tandem::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const char* shapes[] = {
      "--model gpt --layers 4 --heads 8 --width 512 --context 256 --vocab 8192 --batch-size 8",
      "--model llama --layers 4 --heads 8 --kv-heads 2 --width 512 --mlp-hidden 1408 --context 256 --vocab 8192 "
      "--batch-size 8",
  };
  for (const char* shape : shapes)
    for (const char* recompute : {"none", "full"})
      for (const char* graphs : {"on", "off"}) {
        const std::string flags = std::string(shape) + " --recompute " + recompute + " --cuda-graph " + graphs;
        auto r = run_tandem("bench train --device cuda --precision bf16 --steps 3 --warmup 5 " + flags);
        ASSERT_EQ(r.status, 0) << flags << "\n" << r.output;
        const nlohmann::json j = result_of(r.output);
        ASSERT_TRUE(j.is_object() && j.contains("planned_peak_bytes") && j.contains("peak_memory_bytes"))
            << flags << "\n" << r.output;
        const double planned = j["planned_peak_bytes"].get<double>(), measured = j["peak_memory_bytes"].get<double>();
        EXPECT_NEAR(planned / measured, 1.0, 0.10)
            << flags << ": planned " << planned << " bytes (at " << j["planned"].value("peak_at", std::string("?"))
            << "), measured " << measured;
        std::printf("%s: planned %.0f, measured %.0f (%.3f)\n", flags.c_str(), planned, measured, planned / measured);
      }
}
