/* optim_avx512.c - the optimizer template compiled for the avx512 path (flags set in CMakeLists.txt). */
#define ZS_PATH_SUFFIX avx512
#include "optim_tmpl.h"
