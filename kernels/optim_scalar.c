/* optim_scalar.c - the optimizer template compiled for the scalar path (flags set in CMakeLists.txt). */
#define ZS_PATH_SUFFIX scalar
#include "optim_tmpl.h"
