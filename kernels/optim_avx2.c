/* optim_avx2.c - the optimizer template compiled for the avx2 path (flags set in CMakeLists.txt). */
#define ZS_PATH_SUFFIX avx2
#include "optim_tmpl.h"
