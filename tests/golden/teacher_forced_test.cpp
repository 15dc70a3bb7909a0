// Teacher-forced golden test on the CPU backend (issue 3 item 5): per layer, per dumped sequence.
#include "teacher_forced.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "golden_util.h"

using namespace ds4r;
using namespace ds4r::test;

TEST(GoldenTeacherForced, CpuBackendMatchesReferencePerLayer) {
    check_teacher_forced_report(run_teacher_forced("cpu"), "cpu");
}
