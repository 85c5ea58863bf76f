// Compile-time check, no code: the entry points of kernels/emulated/entry_points.h declared
// again after kernels/device_api.h has renamed CUDA's declarations to them. A signature in
// entry_points.h (and so in emulated_runtime.cpp's definitions) that differs from CUDA's is a
// "conflicting declaration" error here.
#include "kernels/device_api.h"
#include "kernels/emulated/entry_points.h"
