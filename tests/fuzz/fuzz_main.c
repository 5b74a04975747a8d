/* fuzz_main.c - the libFuzzer entry point; the build names the target body with -DZS_FUZZ_TARGET=zs_fuzz_... */
#include <stddef.h>
#include <stdint.h>

#include "fuzz.h" /* defines: zs_fuzz_manifest, zs_fuzz_safetensors */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ZS_FUZZ_TARGET(data, size);
    return 0;
}
