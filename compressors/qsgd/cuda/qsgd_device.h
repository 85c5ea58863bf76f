// What other codecs' device paths reuse from qsgd's (cuda/qsgd_device.cpp): terngrad's codes
// are qsgd's 2-bit codes, decoded by qsgd_decode, whose status word it reports.
#pragma once

#include <string>

namespace gradzip::compressors::device {

// qsgd_decode's status word in words (kQsgdStatus* of cuda/qsgd_kernels.h).
std::string describe_qsgd_status(int status);

}  // namespace gradzip::compressors::device
