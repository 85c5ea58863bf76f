// PowerSGD's device row (compressors/cuda/device_codec_row.h): none. It has no element codec;
// the Reducer runs its matrices on the device itself (pipeline/powersgd.cpp).
#include "compressors/cuda/device_codec_row.h"

namespace gradzip::compressors {

const DeviceCodecRow* const powersgd_device_row = nullptr;

}  // namespace gradzip::compressors
