// Writes model/testdata/cpp_export_*/ (see hf_export_testdata.h):
//   bazel run //model/testing:write_hf_export_testdata -- $PWD/model/testdata
#include <iostream>

#include "model/testing/hf_export_testdata.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUT_DIR\n";
    return 2;
  }
  const absl::Status s = ps::testing::WriteHfExportTestdata(argv[1]);
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
