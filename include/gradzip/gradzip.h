// Umbrella header of gradzip's public API.
#pragma once

#include "gradzip/codec.h"
#include "gradzip/compression_spec.h"
#include "gradzip/dtype.h"
#include "gradzip/error.h"
#include "gradzip/reducer.h"
#include "gradzip/tensor_view.h"
#include "gradzip/version.h"
